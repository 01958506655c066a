"""The HTML report of ``stepplan capacity --find cheapest``: the answer first, then the
figure of cost against goodput (the Pareto front joined, the cheapest ringed), the front
as a table, every candidate, and the figures the dollars and times came from.

``capacity --find cheapest`` writes it into its folder as ``report.html``;
``stepplan report FOLDER`` writes it again from ``capacity.csv`` and ``capacity.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ..results.table import ResultsError, Table, read_csv
from ..sweep.cheapest import CHEAPEST

if TYPE_CHECKING:
    from stepplan.plots.report import ReportTable, Verdict

#: The files of a cheapest-deployment folder its report reads.
CHEAPEST_TABLE, CHEAPEST_DOCUMENT = "capacity.csv", "capacity.json"


def is_cheapest_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a cheapest-deployment search (``capacity.json`` says
    ``"find": "cheapest"``)."""
    path = folder / CHEAPEST_DOCUMENT
    if not (folder / CHEAPEST_TABLE).is_file() or not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("find") == "cheapest"
    except (ValueError, AttributeError):
        return False


def read_cheapest_folder(folder: Path) -> tuple[Table, dict[str, Any]]:
    """``capacity.csv`` and ``capacity.json`` of ``folder``; a document without the keys
    the report reads is an error naming it."""
    path = folder / CHEAPEST_DOCUMENT
    try:
        document = json.loads(path.read_text())
        for key in ("slo", "search", "price_per_gpu_hour"):
            document[key]
    except (ValueError, KeyError, TypeError):
        raise ResultsError(
            f"{path}: expected what `stepplan capacity --find cheapest` writes "
            "(slo, search, price_per_gpu_hour)"
        ) from None
    return read_csv(folder / CHEAPEST_TABLE, CHEAPEST), document


def _name(row: dict[str, Any]) -> str:
    pools = ", prefill and decode pools of" if row["disaggregated"] else " x"
    return f"{row['gpu']} tp {row['tensor']}{pools} {row['replicas']}"


def _number(value: Any, digits: int) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def _rows(table: Table) -> list[dict[str, Any]]:
    names = [column.name for column in CHEAPEST.columns]
    return [
        {name: table.column(name)[row].item() for name in names} for row in range(table.num_rows)
    ]


def cheapest_verdict(table: Table, document: dict[str, Any]) -> Verdict:
    """The opening block: the answer (or that none met the SLOs), the grid searched, a
    check per SLO, and where the prices and link figures came from."""
    from stepplan.plots.report import Verdict

    rows = _rows(table)
    answer = next((row for row in rows if row["cheapest"]), None)
    slo = ", ".join(f"{name} <= {limit:g}" for name, limit in document["slo"].items())
    if answer is None:
        headline = f"No candidate meets {slo}: raise --max-replicas or widen the grid"
    else:
        headline = (
            f"Cheapest meeting {slo}: {_name(answer)} ({answer['gpus']} GPUs, "
            f"${answer['usd_per_hour']:,.2f}/h)"
        )
    search = document["search"]
    layouts = search.get("disaggregated", [False])
    subject = (
        f"Searched GPUs {', '.join(search['gpus'])} x tensor parallelism "
        f"{', '.join(map(str, search['tensor']))} x "
        f"{' and '.join('disaggregated' if d else 'co-located' for d in layouts)}"
        f" x 1 to {search['max_replicas']} replicas, at rate scale {document.get('rate_scale')}"
    )
    figures = []
    if answer is not None:
        figures = [
            ("goodput", f"{_number(answer['goodput_req_s'], 2)} req/s"),
            ("TTFT p99", f"{_number(answer['ttft_p99_ms'], 1)} ms"),
            ("TPOT p99", f"{_number(answer['tpot_p99_ms'], 1)} ms"),
        ]
    met = sum(row["met"] for row in rows)
    checks = [(slo, f"met by {met} of {len(rows)} candidates", answer is not None)]
    prices = ", ".join(f"{g} ${p:,.3f}/GPU-h" for g, p in document["price_per_gpu_hour"].items())
    notes = [f"Prices: {prices} ({document.get('price_source', 'given')})."]
    links = document.get("interconnect") or {}
    if links:
        shown = "; ".join(
            f"{gpu} {link['link']} {_number((link['link_bw_bytes_s'] or math.nan) / 1e9, 0)} GB/s"
            for gpu, link in links.items()
        )
        notes.append(f"Tensor-parallel all-reduces over: {shown}.")
    kv = document.get("kv_link")
    if kv:
        notes.append(f"Disaggregated candidates move KV and conv state over {kv['part']}.")
    if document.get("complete") is False:
        notes.append("The search was stopped early: the table holds the candidates so far.")
    return Verdict(headline, subject, figures, checks, notes)


def candidate_figures(row: dict[str, Any]) -> list[str]:
    """One candidate's replicas, GPUs, $/h, goodput, TTFT p99 and TPOT p99 (ms), as the
    console's table and the report's show them."""
    return [
        str(row["replicas"] or "-"),
        str(row["gpus"] or "-"),
        _number(row["usd_per_hour"], 2),
        _number(row["goodput_req_s"], 2),
        _number(row["ttft_p99_ms"], 1),
        _number(row["tpot_p99_ms"], 1),
    ]


def _table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    return [
        [
            row["gpu"],
            str(row["tensor"]),
            "disaggregated" if row["disaggregated"] else "co-located",
            *candidate_figures(row),
            row["refused"] or ("yes" if row["met"] else "no"),
        ]
        for row in rows
    ]


def cheapest_tables(table: Table) -> tuple[ReportTable, ReportTable]:
    """The Pareto front of cost against goodput (cheapest first) and every candidate."""
    from stepplan.plots.report import ReportTable

    rows = _rows(table)
    header = ["gpu", "tp", "layout", "replicas", "GPUs", "$/h", "goodput req/s"]
    header += ["TTFT p99 ms", "TPOT p99 ms", "meets"]
    front = sorted((row for row in rows if row["pareto"]), key=lambda row: row["usd_per_hour"])
    return (
        ReportTable(
            "Pareto front: no other candidate costs less for more goodput",
            header,
            _table_rows(front),
        ),
        ReportTable(f"Every candidate ({len(rows)})", header, _table_rows(rows)),
    )


def cheapest_page(title: str, table: Table, document: dict[str, Any]) -> str:
    """The report's HTML text."""
    from stepplan.plots.report import build_sweep_report as page
    from stepplan.plots.sweep import plot_cost_front

    figures = {}
    if np.any(table.column("met")):
        figures["Cost against goodput of the candidates that met the SLOs"] = plot_cost_front(
            table, title="$/hour against goodput: the Pareto front joined, the cheapest ringed"
        )
    return page(
        title,
        verdict=cheapest_verdict(table, document),
        figures=figures,
        tables=cheapest_tables(table),
    )
