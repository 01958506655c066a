"""``stepplan capacity --find cheapest --gpus H100,H200 --tensor 1,2 --disaggregation
off,on``: the cheapest deployment (GPU preset x tensor-parallel ranks x co-located or
disaggregated x replicas) that meets every SLO at the settings' request rate
(``sweep/cheapest.py``).

Each pair's replica search runs as in ``--find replicas``, its counts' records kept in
``points/`` of one folder, so a re-run finds them done. Written: ``capacity.csv`` (every
pair: its replicas, price, figures, whether it met the SLOs, the Pareto front of cost
against goodput, or why it was refused) and ``capacity.json`` (the answer and the table).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from ..results.outdir import config_digest
from ..results.table import Table
from ..settings.config import ConfigError, SimConfig, with_settings
from ..settings.gpus import PRICE_SOURCE, find_preset
from ..settings.links import KV_LINKS
from ..sweep.cheapest import (
    CHEAPEST,
    DEFAULT_GPUS,
    DEFAULT_LAYOUTS,
    DEFAULT_TENSOR,
    Candidate,
    cheapest,
    check_grid,
    pareto_front,
    parse_gpus,
    parse_layouts,
    parse_tensors,
)
from ..sweep.records import RECORDS, metric, write_table
from ..sweep.replica_search import check_most, replica_search
from ..sweep.spec import TraceEntry
from ..sweep.tradeoff import Slo
from .capacity_replicas import FILES as REPLICA_FILES
from .capacity_replicas import ReplicaRun, SearchStopped
from .options import checked, run_name
from .report_capacity import candidate_figures, cheapest_page
from .signals import StopRequest
from .sweep_run import PointRun, TraceReader, check_points, claim_folder, runner_for
from .tables import align

FILES = (*REPLICA_FILES, "capacity.png", "report.html")


def _pair_config(config: SimConfig, gpu: str, tensor: int, split: bool = False) -> SimConfig:
    """The candidate's settings; disaggregated, both pools of ``gpu`` at ``tensor``
    (the replica search sets the pools' counts)."""
    pools: dict[str, object] = {"disaggregation.prefill_replicas": 0}
    if split:
        pools = {
            "disaggregation.prefill_replicas": 1,
            "disaggregation.prefill_gpu": gpu,
            "disaggregation.prefill_tensor": tensor,
        }
    return with_settings(config, {"gpu.name": gpu, "parallel.tensor": tensor, **pools})


def _candidate(
    search: ReplicaRun, slo: Slo, stop: StopRequest, most: int, per_round: int
) -> Candidate:
    """Search one pair's replicas; refused (not raised) when its settings cannot run."""
    gpu, tensor = search.config.gpu.name, search.config.parallel.tensor
    split = search.config.disaggregation.enabled
    try:
        check_points([search.point(1)], search.run.reader, None)
    except ConfigError as exc:
        return Candidate(gpu, tensor, refused=str(exc), disaggregated=split)
    result = replica_search(search.evaluate(slo, stop), most, per_round)
    if result.answer is None:
        return Candidate(gpu, tensor, disaggregated=split)
    summary = search.run.records[search.points[result.answer].digest].summary

    def figure(name: str) -> float:
        value = metric(summary, name)
        return math.nan if value is None else float(value)

    return Candidate(
        gpu,
        tensor,
        result.answer,
        metric(summary, "usd_per_hour"),
        figure("goodput_req_s"),
        figure("ttft_p99_ms"),
        figure("tpot_p99_ms"),
        disaggregated=split,
    )


def candidate_table(candidates: list[Candidate]) -> Table:
    """``capacity.csv``: one row per pair, the front and the answer marked."""
    cost = np.array([c.usd_per_hour if c.met else math.nan for c in candidates], np.float64)
    goodput = np.array([c.goodput_req_s if c.met else math.nan for c in candidates])
    answer = cheapest(candidates)
    columns: dict[str, Any] = {
        "gpu": np.array([c.gpu for c in candidates], dtype=str),
        "tensor": np.array([c.tensor for c in candidates], np.int64),
        "disaggregated": np.array([c.disaggregated for c in candidates], np.int64),
        "replicas": np.array([c.replicas or 0 for c in candidates], np.int64),
        "gpus": np.array([c.gpus for c in candidates], np.int64),
        "usd_per_hour": cost,
        "goodput_req_s": goodput,
        "ttft_p99_ms": np.array([c.ttft_p99_ms for c in candidates], np.float64),
        "tpot_p99_ms": np.array([c.tpot_p99_ms for c in candidates], np.float64),
        "met": np.array([c.met for c in candidates], np.int64),
        "pareto": pareto_front(cost, goodput).astype(np.int64),
        "cheapest": np.array([c is answer for c in candidates], np.int64),
        "refused": np.array([c.refused for c in candidates], dtype=str),
    }
    return Table.from_columns(CHEAPEST.file, columns, CHEAPEST)


def run_cheapest_capacity(args: argparse.Namespace, config: SimConfig, slo: Slo) -> int:
    """Search every pair, write the table, print it and the answer."""
    gpus = parse_gpus(args.gpus or DEFAULT_GPUS)
    tensors = parse_tensors(args.tensor or DEFAULT_TENSOR)
    layouts = parse_layouts(args.disaggregation or DEFAULT_LAYOUTS)
    runner, where = runner_for(args)
    per_round = args.per_round or args.workers or 2
    check_most(args.max_replicas, per_round)
    check_grid(gpus, tensors, args.max_replicas, layouts)
    entry = TraceEntry(args.trace, args.format, run_name(args, config), "TRACE")
    stop: StopRequest = getattr(args, "stop", None) or StopRequest()
    reader = TraceReader()
    key = [reader.identity(entry), entry.format, config.to_dict(), slo.to_dict()]
    grid = [args.max_replicas, gpus, tensors] + ([layouts] if layouts != (False,) else [])
    digest = config_digest([*key, *grid])
    with claim_folder(args, f"capacity-cheapest-{entry.label}-{digest}", "capacity", FILES) as f:
        run = PointRun(f, reader, runner, quiet=True, label="capacity")
        searches = [
            _pair(config, g, t, s, run, entry) for s in layouts for g in gpus for t in tensors
        ]
        run.load(args.overwrite)
        if not args.quiet:
            print(f"stepplan: capacity: {len(searches)} pairs on {where}", file=sys.stderr)
        candidates: list[Candidate] = []
        try:
            for search in searches:
                if isinstance(search, Candidate):
                    candidates.append(search)
                    continue
                candidates.append(_candidate(search, slo, stop, args.max_replicas, per_round))
        except SearchStopped:
            pass
        complete = len(candidates) == len(searches)
        table = candidate_table(candidates)
        document = _document(args, config, slo, table, complete, (gpus, tensors, layouts))
        if not candidates:
            stop.raise_if_stopped("no pair had finished, nothing written")

        png = _figure(table, slo)
        page = cheapest_page(f.path.name, table, document)

        def write(stage: Path) -> list[str]:
            names = write_table(stage, table)
            (stage / "capacity.json").write_text(json.dumps(document, indent=2) + "\n")
            (stage / "report.html").write_text(page)
            if png is None:
                return [*names, "capacity.json", "report.html"]
            (stage / "capacity.png").write_bytes(png)
            return [*names, "capacity.json", "report.html", "capacity.png"]

        f.put(write, complete=complete, keep=[RECORDS])
    if not args.quiet:
        print(_report(table, slo, config))
    if not args.quiet or not args.out:
        print(f"results: {f.shown}/capacity.csv, capacity.json, capacity.png, report.html")
    stop.raise_if_stopped(f"{len(candidates)} pairs searched: the table so far is in {f.shown}/")
    return 0


def _figure(table: Table, slo: Slo) -> bytes | None:
    """``capacity.png``: cost against goodput; ``None`` when no pair met the SLOs."""
    if not table.column("met").any():
        return None
    from stepplan.plots.canvas import figure_bytes
    from stepplan.plots.sweep import plot_cost_front

    title = f"Deployments meeting {slo.text()}: cost against goodput"
    return figure_bytes(plot_cost_front(table, title=title), "png")


def _pair(
    config: SimConfig, gpu: str, tensor: int, split: bool, run: PointRun, entry: TraceEntry
) -> ReplicaRun | Candidate:
    """The candidate's replica search, or a refused candidate when its settings break a
    rule (the ranks do not split the model, a measured profile times one GPU)."""
    try:
        own = checked(_pair_config(config, gpu, tensor, split))
    except ConfigError as exc:
        return Candidate(gpu, tensor, refused=str(exc), disaggregated=split)
    return ReplicaRun(own, run, entry, True)


def _interconnect(config: SimConfig, gpu: str) -> dict[str, Any]:
    """The link ``gpu``'s tensor-parallel all-reduces were timed over."""
    resolved = _pair_config(config, gpu, 1).gpu.resolved()
    preset = find_preset(gpu)
    return {
        "link": preset.link.name if preset is not None else "custom",
        "link_bw_bytes_s": resolved.link_bw_bytes_s,
        "link_latency_us": resolved.link_latency_us,
    }


def _kv_link(config: SimConfig) -> dict[str, Any]:
    """The link a disaggregated candidate's requests crossed (``settings/links.py``)."""
    link = KV_LINKS[config.disaggregation.link]
    bandwidth = None if math.isinf(link.bw_bytes_s) else link.bw_bytes_s
    return {
        "name": link.name,
        "part": link.part,
        "bw_bytes_s": bandwidth,
        "latency_us": link.latency_us,
    }


def _rows(table: Table) -> list[dict[str, Any]]:
    def cell(value: Any) -> Any:
        if isinstance(value, np.floating):
            return None if value != value else float(value)
        return value.item() if isinstance(value, np.generic) else value

    names = [column.name for column in CHEAPEST.columns]
    return [{n: cell(table.column(n)[row]) for n in names} for row in range(table.num_rows)]


def _document(
    args: argparse.Namespace,
    config: SimConfig,
    slo: Slo,
    table: Table,
    complete: bool,
    grid: tuple[tuple[str, ...], tuple[int, ...], tuple[bool, ...]],
) -> dict[str, Any]:
    """``capacity.json``: the answer, the grid searched (``grid``: GPUs, ranks, layouts),
    the figures it priced and timed with, and the table."""
    gpus, tensors, layouts = grid
    rows = _rows(table)
    answer = next((row for row in rows if row["cheapest"]), None)
    return {
        "find": "cheapest",
        "slo": slo.to_dict(),
        "router": config.deployment.router,
        "rate_scale": config.workload.rate_scale,
        "search": {
            "gpus": list(gpus),
            "tensor": list(tensors),
            "disaggregated": list(layouts),
            "max_replicas": args.max_replicas,
        },
        "price_per_gpu_hour": {
            gpu: _pair_config(config, gpu, 1).gpu.resolved().price_per_hour for gpu in gpus
        },
        "price_source": PRICE_SOURCE,
        "interconnect": {gpu: _interconnect(config, gpu) for gpu in gpus},
        "kv_link": _kv_link(config) if True in layouts else None,
        "complete": complete,
        "answer": answer,
        "candidates": rows,
    }


def _report(table: Table, slo: Slo, config: SimConfig) -> str:
    rows = _rows(table)

    body = [
        [
            row["gpu"],
            str(row["tensor"]),
            "split" if row["disaggregated"] else "",
            *candidate_figures(row),
            "refused" if row["refused"] else ("yes" if row["met"] else "no"),
            "*" if row["pareto"] else "",
        ]
        for row in rows
    ]
    header = ["gpu", "tp", "pools", "replicas", "gpus", "$/h", "goodput", "ttft p99", "tpot p99"]
    lines = [align([*header, "meets", "front"], body) if body else "(no pair ran)"]
    lines += [
        f"refused: {r['gpu']} tp {r['tensor']}{' split' if r['disaggregated'] else ''}: "
        f"{r['refused']}"
        for r in rows
        if r["refused"]
    ]
    answer = next((row for row in rows if row["cheapest"]), None)
    where = f"behind {config.deployment.router} at rate scale {config.workload.rate_scale:g}"
    if answer is None:
        lines.append(f"capacity: no pair meets {slo.text()} {where}: raise --max-replicas")
    else:
        pools = " per pool, prefill apart from decode" if answer["disaggregated"] else ""
        lines.append(
            f"capacity: cheapest: {answer['replicas']} x {answer['gpu']} at tp "
            f"{answer['tensor']}{pools} ({answer['gpus']} GPUs, "
            f"${answer['usd_per_hour']:,.2f}/h) {where} meets {slo.text()}"
        )
    lines.append(_figures_line(config, rows))
    return "\n".join(lines)


def _figures_line(config: SimConfig, rows: list[dict[str, Any]]) -> str:
    """Where the table's dollars and times came from: each GPU's price and link, and the
    KV link of the disaggregated rows."""
    gpus = dict.fromkeys(row["gpu"] for row in rows)
    parts = []
    for gpu in gpus:
        price = _pair_config(config, gpu, 1).gpu.resolved().price_per_hour
        link = _interconnect(config, gpu)
        bandwidth = link["link_bw_bytes_s"]
        shown = "-" if bandwidth is None else f"{bandwidth / 1e9:,.0f} GB/s"
        priced = "no price" if price is None else f"${price:,.3f}/GPU-h"
        parts.append(f"{gpu} {priced}, {link['link']} {shown}")
    line = f"figures: {'; '.join(parts)} (prices: {PRICE_SOURCE})"
    if any(row["disaggregated"] for row in rows):
        kv = _kv_link(config)
        line += f"; KV link {kv['part']}, {kv['latency_us']} us"
    return line
