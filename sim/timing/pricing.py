"""What a run's deployment costs in dollars: its GPUs held for the run's duration at the
GPU's hourly price (``gpu.price_per_hour``; the presets' in ``docs/presets.md``).

A deployment of ``gpus`` GPUs (one replica of ``parallel.tensor`` ranks) costs
``price_per_hour * gpus`` per hour, whether busy or idle: the run holds them from its
start to its last finish (``duration_s``). Per million output tokens that is
``price_per_hour * gpus * duration_s / 3600 / output_tokens * 1e6``, and goodput per
dollar is the good requests (both SLOs met) per dollar of the run.
"""

from __future__ import annotations

from typing import Any

SECONDS_PER_HOUR = 3600.0
#: The sweep and capacity tables' dollar columns: (column, unit, key of the summary's
#: ``dollars``, meaning); ``schema.py`` declares them from this.
SWEEP_DOLLAR_COLUMNS = (
    ("usd_per_hour", "$/h", "per_hour", "the deployment's GPUs per hour"),
    ("usd_per_m_output_tokens", "$", "per_million_output_tokens", "per million output tokens"),
    ("good_requests_per_usd", "req/$", "good_requests_per_dollar", "good requests per dollar"),
)


def deployment_dollars(
    price_per_hour: float | None,
    gpus: int,
    duration_s: float,
    output_tokens: int,
    good_requests: int,
) -> dict[str, Any]:
    """The summary's ``dollars`` section: ``per_hour`` (the deployment), ``run`` (held for
    ``duration_s``), ``per_million_output_tokens`` and ``good_requests_per_dollar``;
    ``None`` where the price is unknown (a custom GPU) or a figure would divide by 0."""
    per_hour = None if price_per_hour is None else price_per_hour * gpus
    run = None if per_hour is None else per_hour * duration_s / SECONDS_PER_HOUR
    return {
        "price_per_gpu_hour": price_per_hour,
        "gpus": gpus,
        "per_hour": per_hour,
        "run": run,
        "per_million_output_tokens": (
            run / output_tokens * 1e6 if run is not None and output_tokens else None
        ),
        "good_requests_per_dollar": good_requests / run if run else None,
    }


def dollar_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The dollar lines of the summary table (none for summaries without them)."""
    dollars = summary.get("dollars")
    if not isinstance(dollars, dict):
        return []

    def cell(key: str, digits: int) -> str:
        value = dollars.get(key)
        return "-" if value is None else f"{value:,.{digits}f}"

    return [
        ("GPUs", f"{dollars['gpus']:,}"),
        ("$ per hour", cell("per_hour", 2)),
        ("$ per M output tokens", cell("per_million_output_tokens", 3)),
        ("good requests per $", cell("good_requests_per_dollar", 1)),
    ]


def _pool_cell(pool: dict[str, Any]) -> str:
    price = pool.get("price_per_gpu_hour")
    priced = "no price" if price is None else f"${price:,.3f}/GPU-h"
    return (
        f"{pool['replicas']} x {pool['gpu']} tp {pool['tensor']}, {priced}, "
        f"queue mean {pool['mean_queue']:.2f} peak {pool['peak_queue']}"
    )


def figure_rows(summary: dict[str, Any]) -> list[tuple[str, str]]:
    """The summary table's lines naming the figures its dollars and times came from: the
    price per GPU-hour, the GPUs' link where tensor parallelism used it, and with a prefill
    pool each pool and the link between them (``summary.json``: ``gpu``,
    ``disaggregation``)."""
    rows = []
    gpu, config = summary.get("gpu"), summary.get("config", {})
    if isinstance(gpu, dict) and gpu.get("price_per_hour") is not None:
        rows.append(("$ per GPU-hour", f"{gpu['price_per_hour']:,.3f} ({gpu.get('name')})"))
    tensor = config.get("parallel", {}).get("tensor", 1) if isinstance(config, dict) else 1
    if isinstance(gpu, dict) and tensor > 1 and gpu.get("link_bw_bytes_s") is not None:
        rows.append(
            (
                "GPU link",
                f"{gpu.get('link')}, {gpu['link_bw_bytes_s'] / 1e9:,.0f} GB/s, "
                f"{gpu['link_latency_us']} us per ring step",
            )
        )
    split = summary.get("disaggregation")
    if not isinstance(split, dict):
        return rows
    for name, pool in split["pools"].items():
        rows.append((f"{name} pool", _pool_cell(pool)))
    link, moved = split["link"], split["transfers"]
    rows.append(("KV link", f"{link['part']}, {link['latency_us']} us latency"))
    mean = moved["seconds_mean"]
    rows.append(("KV transfer mean ms", "-" if mean is None else f"{mean * 1e3:,.3f}"))
    return rows
