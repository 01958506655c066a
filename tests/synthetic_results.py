"""A small results folder in the simulator's schema, for plot, bucket and report tests.

Steps are drawn at random (pure spec steps, and mixed steps with a prefill chunk),
then bucketed by the planner's rule for vLLM's default sizes in ``full`` mode, so
the folder is internally consistent without running the simulator.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from stepplan.planner import default_graph_sizes
from stepplan.sim.buckets.demand import assign, step_demand
from stepplan.sim.results.schema import (
    COST_COLUMNS,
    KIND_ROWS,
    KIND_TOKENS,
    REQUESTS,
    STEPS_IN_MEMORY,
    TableSchema,
)
from stepplan.sim.results.sim_result import SimResult, write_results

#: Each cost column's share of a step's duration (``COST_COLUMNS`` order).
COST_SHARES = (0.9, 0.05, 0.03, 0.02, 0.0, 0.0)


def in_schema(schema: TableSchema, columns: dict) -> dict[str, np.ndarray]:
    """``columns`` in the schema's order and types (a column missing is a KeyError)."""
    return {c.name: np.asarray(columns[c.name]).astype(c.numpy_dtype) for c in schema.columns}


def synthetic_steps(num_steps: int, seed: int, num_spec_tokens: int = 3) -> dict[str, np.ndarray]:
    """The steps' columns (``[S]`` each, ``schema.STEPS_IN_MEMORY``), in order."""
    rng = np.random.default_rng(seed)
    q = num_spec_tokens + 1
    spec_rows = rng.integers(1, 120, num_steps)
    prefill_rows = (rng.random(num_steps) < 0.3).astype(np.int64)
    none = np.zeros(num_steps, np.int64)
    rows = (spec_rows, none, prefill_rows)
    tokens = (spec_rows * q, none, prefill_rows * rng.integers(2, 2048, num_steps))
    columns = {
        **dict(zip(KIND_ROWS.values(), rows, strict=True)),
        **dict(zip(KIND_TOKENS.values(), tokens, strict=True)),
    }
    demand = step_demand(
        columns, num_spec_tokens=num_spec_tokens, graph_mode="full", max_num_seqs=256
    )
    graphs = assign(demand, default_graph_sizes(256, num_spec_tokens))
    hit = graphs.graph_tokens > 0
    duration = rng.uniform(0.005, 0.03, num_steps)
    columns.update(
        step=np.arange(num_steps),
        start_s=np.concatenate([[0.0], np.cumsum(duration)[:-1]]),
        duration_s=duration,
        num_rows=demand.rows,
        num_tokens=demand.tokens,
        graph_kind=np.where(hit, "spec", ""),
        graph_tokens=graphs.graph_tokens,
        graph_rows=graphs.graph_rows,
        graph_hit=hit.astype(np.int64),
        padded_tokens=np.where(hit, graphs.graph_tokens - demand.tokens, 0),
        padded_rows=np.where(hit, graphs.graph_rows - demand.rows, 0),
        plan_us=rng.uniform(5.0, 40.0, num_steps),
        num_waiting=rng.integers(0, 30, num_steps),
        num_preempted=(rng.random(num_steps) < 0.02).astype(np.int64),
        kv_used_blocks=rng.integers(0, 1000, num_steps),
        kv_cached_blocks=rng.integers(0, 100, num_steps),
    )
    columns["kv_usage"] = columns["kv_used_blocks"] / 1000.0
    for column, share in zip(COST_COLUMNS, COST_SHARES, strict=True):
        columns[column.name] = duration * share
    return in_schema(STEPS_IN_MEMORY, columns)


def synthetic_requests(num_requests: int, seed: int) -> dict[str, np.ndarray]:
    """Request columns of ``requests.csv`` (``[n]`` each), in its order; the first request
    has one output token."""
    rng = np.random.default_rng(seed + 1)
    arrival = np.sort(rng.uniform(0.0, 5.0, num_requests))
    ttft = rng.uniform(0.02, 0.4, num_requests)
    output = rng.integers(1, 200, num_requests)
    output[0] = 1
    tpot = np.where(output > 1, rng.uniform(0.005, 0.03, num_requests), np.nan)
    e2e = ttft + np.nan_to_num(tpot) * (output - 1)
    columns = {
        "request_id": np.arange(num_requests),
        "arrival_s": arrival,
        "prompt_tokens": rng.integers(10, 4000, num_requests),
        "output_tokens": output,
        "first_token_s": arrival + ttft,
        "finish_s": arrival + e2e,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
        "num_steps": np.maximum(output // 3, 1),
        "accepted_tokens": output,
        "drafted_tokens": output * 2,
        "num_preemptions": np.zeros(num_requests, np.int64),
        "recomputed_tokens": np.zeros(num_requests, np.int64),
        "cached_tokens": np.zeros(num_requests, np.int64),
    }
    return in_schema(REQUESTS, columns)


def synthetic_summary(steps: dict, requests: dict, num_spec_tokens: int = 3) -> dict:
    """A ``summary.json`` object consistent with the tables."""
    itl = np.sort(np.random.default_rng(7).uniform(4.0, 40.0, 101))

    def stats(values: np.ndarray) -> dict[str, float]:
        values = values[np.isfinite(values)] * 1e3
        quantiles = np.percentile(values, [50, 90, 99])
        return {
            "mean": float(values.mean()),
            **dict(zip(("p50", "p90", "p99"), quantiles.tolist(), strict=True)),
        }

    tokens = int(steps["num_tokens"].sum())
    padded = int(steps["padded_tokens"].sum())
    return {
        "stepplan_version": "0.1.0",
        "config": {
            "name": "synthetic",
            "scheduler": {"max_num_seqs": 256, "num_spec_tokens": num_spec_tokens, "num_groups": 2},
            "planner": {"graph_mode": "full", "graph_sizes": None},
        },
        "trace": {
            "path": "synthetic",
            "format": "synthetic",
            "requests": len(requests["request_id"]),
            "span_s": 5.0,
        },
        "requests": len(requests["request_id"]),
        "duration_s": float(steps["start_s"][-1] + steps["duration_s"][-1]),
        "throughput": {"output_tokens_per_s": 1234.5, "requests_per_s": 6.25},
        "goodput": {"requests_per_s": 5.5, "share": 0.88},
        "latency_ms": {
            "ttft": stats(requests["ttft_s"]),
            "tpot": stats(requests["tpot_s"]),
            "itl": {
                "mean": float(itl.mean()),
                "p50": float(itl[50]),
                "p90": float(itl[90]),
                "p99": float(itl[99]),
            },
            "e2e": stats(requests["e2e_s"]),
        },
        "itl_ms_quantiles": itl.tolist(),
        "steps": {
            "count": len(steps["step"]),
            "graph_hits": int(steps["graph_hit"].sum()),
            "graph_hit_rate": float(steps["graph_hit"].mean()),
            "padded_tokens": padded,
            "padded_token_share": padded / (tokens + padded),
            "padded_rows": int(steps["padded_rows"].sum()),
            "tokens": tokens,
        },
        "acceptance": {"mean_length": 3.21},
        "host": {"plan_us_p50": 17.25, "plan_us_p90": 31.5, "plan_us_mean": 19.125},
        "time_s": {"model": 1.5, "short_conv": 0.0625, "host": 0.03125, "launch": 0.015625},
    }


def write_synthetic_results(
    folder: Path, num_steps: int = 300, num_requests: int = 40, seed: int = 0
) -> Path:
    """Write ``steps.csv``, ``requests.csv`` and ``summary.json`` into ``folder`` with the
    simulator's own writer."""
    steps = synthetic_steps(num_steps, seed)
    requests = synthetic_requests(num_requests, seed)
    summary = synthetic_summary(steps, requests)
    return write_results(SimResult(steps, requests, np.zeros(0), summary), folder)
