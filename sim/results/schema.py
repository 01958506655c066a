"""The results schema: every file of a results folder, every column of its tables (name,
type, unit, meaning) and every top-level key of its JSON documents, declared once.

The writer and the reader (``results.py``), the loop's records (``records.py``), the
plots and the test fixtures take their column names and types from here;
``docs/results.md`` is :func:`markdown` of it (``python -m stepplan.sim.results.schema`` prints
it; a test keeps the two equal). The cost columns are :data:`~.cost.COST_TERMS` and
the memory columns :class:`~.scheduler.StepMemory`'s fields: a new field there is a new
column here, and importing this module fails until it has a meaning below.
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from types import MappingProxyType

import attrs
import numpy as np

from ..scheduler.step import StepMemory
from ..timing.cost import COST_TERMS
from ..timing.pricing import SWEEP_DOLLAR_COLUMNS

INT, FLOAT, TEXT = "int64", "float64", "text"
#: Each type's numpy dtype in memory (text columns are numpy strings).
NUMPY_DTYPES: Mapping[str, type] = MappingProxyType({INT: np.int64, FLOAT: np.float64, TEXT: str})


@attrs.frozen
class Column:
    """One column of a results table.

    Attributes:
        name: its name in the file's header and in memory.
        dtype: ``int64``, ``float64`` (an empty cell is NaN) or ``text``.
        unit: ``s``, ``us``, ``tokens``, ... (empty for ids, flags and text).
        meaning: one line.
    """

    name: str
    dtype: str = attrs.field(validator=attrs.validators.in_(tuple(NUMPY_DTYPES)))
    unit: str
    meaning: str

    @property
    def numpy_dtype(self) -> type:
        """The column's dtype in memory."""
        return NUMPY_DTYPES[self.dtype]


@attrs.frozen
class TableSchema:
    """The columns of one table, in the file's order.

    Attributes:
        file: its file name (``.csv``; ``.parquet`` holds the same columns).
        meaning: what one row is.
        columns: every column, in order.
        renamed: old column name -> new, for reading folders of older versions.
    """

    file: str
    meaning: str
    columns: tuple[Column, ...]
    renamed: Mapping[str, str] = attrs.field(factory=dict, converter=MappingProxyType)

    @property
    def names(self) -> tuple[str, ...]:
        """The column names, in order."""
        return tuple(column.name for column in self.columns)

    def get(self, name: str) -> Column | None:
        """The column ``name``, or ``None`` when the schema has none of that name."""
        return next((column for column in self.columns if column.name == name), None)

    def joined(self, other: TableSchema, key: str) -> TableSchema:
        """This table with ``other``'s columns but ``key`` (the one they share) after its own."""
        extra = tuple(column for column in other.columns if column.name != key)
        return attrs.evolve(self, columns=self.columns + extra)


@attrs.frozen
class SummaryKey:
    """One top-level key of ``summary.json`` or ``measured.json``.

    Attributes:
        name: the key.
        meaning: one line.
        keys: the keys of its object, when they are fixed (``None``: a value, or an
            object whose keys vary); given as one string, split at spaces.
    """

    name: str
    meaning: str
    keys: tuple[str, ...] | None = attrs.field(
        default=None, converter=lambda keys: tuple(keys.split()) if isinstance(keys, str) else keys
    )


def _check_named(what: str, meanings: Mapping[str, object], names: tuple[str, ...]) -> None:
    """Refuse, at import, a field of ``names`` without a meaning here or a meaning too many."""
    if tuple(meanings) != names:
        raise ImportError(f"schema: {what} {names} need a meaning each here, in order")


_COST = {
    "model": "roofline of everything but the short conv (weights, KV, FLOPs)",
    "conv": "the short conv of every conv layer, from the kernel profile",
    "host": "host time of the step's conv metadata (``cost.host_cost``)",
    "launch": "kernel-launch time not hidden behind the GPU's work",
    "engine": "a profiled engine's whole step (``cost.profile``); 0 for other steps",
    "allreduce": "tensor parallelism's all-reduces, two per layer (0 on one GPU)",
}
_check_named("cost terms", _COST, COST_TERMS)
#: ``steps.csv``'s cost columns, ``<term>_s``: ``duration_s`` is their sum.
COST_COLUMNS = tuple(Column(f"{term}_s", FLOAT, "s", meaning) for term, meaning in _COST.items())

_MEMORY = {
    "num_waiting": ("requests", "requests arrived but not running (preempted ones included)"),
    "num_preempted": ("requests", "requests preempted while scheduling the step"),
    "kv_used_blocks": ("blocks", "KV blocks held by running requests (shared cached ones too)"),
    "kv_cached_blocks": ("blocks", "blocks of cached prefixes nobody references (evictable)"),
    "kv_usage": ("", "kv_used_blocks / capacity (0 without a memory model)"),
}
_MEMORY_TYPES = {int: INT, float: FLOAT}
_check_named("StepMemory fields", _MEMORY, tuple(f.name for f in attrs.fields(StepMemory)))
#: ``steps.csv``'s memory columns: :class:`StepMemory`'s fields, in order.
MEMORY_COLUMNS = tuple(
    Column(name, _MEMORY_TYPES[kind], *_MEMORY[name])
    for name, kind in typing.get_type_hints(StepMemory).items()
)

#: Per batch kind, ``steps.csv``'s live rows and tokens (the plan's fields of these names).
KIND_ROWS = MappingProxyType(
    {"spec": "num_spec_rows", "decode": "num_decode_rows", "prefill": "num_prefill_rows"}
)
KIND_TOKENS = MappingProxyType(
    {
        "spec": "num_spec_decode_tokens",
        "decode": "num_decode_tokens",
        "prefill": "num_prefill_tokens",
    }
)
#: ``graph_kind``'s values; the loop records each as its index (0: eager, empty text).
GRAPH_KINDS = ("", "spec", "decode", "mixed")

STEPS = TableSchema(
    "steps.csv",
    "one step, in the order the steps ran",
    (
        Column("step", INT, "", "the step's number, from 0"),
        Column("start_s", FLOAT, "s", "when the step began on the simulated clock"),
        Column("duration_s", FLOAT, "s", "the step's time: the cost columns added"),
        Column(KIND_ROWS["spec"], INT, "rows", "live spec-decode rows of the plan"),
        Column(KIND_ROWS["decode"], INT, "rows", "live plain-decode rows"),
        Column(KIND_ROWS["prefill"], INT, "rows", "live prefill rows (chunks)"),
        Column(KIND_TOKENS["spec"], INT, "tokens", "tokens of the spec rows (1 + drafts each)"),
        Column(KIND_TOKENS["decode"], INT, "tokens", "tokens of the decode rows (1 each)"),
        Column(KIND_TOKENS["prefill"], INT, "tokens", "tokens of the prefill rows"),
        Column("num_rows", INT, "rows", "live rows: the three kinds added"),
        Column("num_tokens", INT, "tokens", "live tokens: the three kinds added"),
        Column("graph_kind", TEXT, "", "graph replayed: spec, decode, mixed; empty: eager"),
        Column("graph_tokens", INT, "tokens", "the graph's token capacity (0 when eager)"),
        Column("graph_rows", INT, "rows", "the graph's row capacity (0 when eager)"),
        Column("graph_hit", INT, "", "1 when the step replayed a graph, else 0"),
        Column("padded_tokens", INT, "tokens", "the plan's token capacity less its live tokens"),
        Column("padded_rows", INT, "rows", "the plan's row capacity less its live rows"),
        *COST_COLUMNS,
        *MEMORY_COLUMNS,
    ),
    # Older folders' name, which the config also used for drafts per request.
    renamed={"num_spec_tokens": KIND_TOKENS["spec"]},
)
MEASURED_STEPS = TableSchema(
    "measured_steps.csv",
    "one step's measured figures (they vary from run to run)",
    (
        Column("step", INT, "", "the step's number, as in steps.csv"),
        Column("plan_us", FLOAT, "us", "the planner's host wall time for the step (see below)"),
    ),
)
#: The steps in memory (``SimResult.steps``): ``steps.csv``'s, then the measured ones.
STEPS_IN_MEMORY = STEPS.joined(MEASURED_STEPS, "step")
REQUESTS = TableSchema(
    "requests.csv",
    "one request, in arrival order",
    (
        Column("request_id", INT, "", "the request's row in the trace after filtering"),
        Column("arrival_s", FLOAT, "s", "arrival on the simulated clock"),
        Column("prompt_tokens", INT, "tokens", "prompt length"),
        Column("output_tokens", INT, "tokens", "output length"),
        Column("first_token_s", FLOAT, "s", "when its first token came; empty until then"),
        Column("finish_s", FLOAT, "s", "when its last token came; empty if not finished"),
        Column("ttft_s", FLOAT, "s", "time to first token: first_token_s - arrival_s"),
        Column("tpot_s", FLOAT, "s", "(finish - first token) / (output - 1); empty for 1 token"),
        Column("e2e_s", FLOAT, "s", "finish_s - arrival_s"),
        Column("num_steps", INT, "steps", "steps the request was scheduled in"),
        Column("accepted_tokens", INT, "tokens", "drafts accepted over its spec steps"),
        Column("drafted_tokens", INT, "tokens", "drafts verified over its spec steps"),
        Column("num_preemptions", INT, "", "times it was preempted (docs/memory.md)"),
        Column("recomputed_tokens", INT, "tokens", "tokens lost to preemption, computed again"),
        Column("cached_tokens", INT, "tokens", "prompt tokens the prefix cache saved it"),
    ),
)
TABLES = (STEPS, REQUESTS, MEASURED_STEPS)
#: The column of a table of distinct step shapes (``results.step_shapes``): how many
#: steps had the row's shape.
STEP_COUNT = "step_count"

#: Names of the cost terms in the summary's ``time_s`` where they differ from the term's.
TIME_NAMES = MappingProxyType({"conv": "short_conv"})
#: The summary's section that goes to ``measured.json`` (and comes back from it).
MEASURED = "measured"
_STATS = ("mean", "p50", "p90", "p99")

SUMMARY = (
    SummaryKey("stepplan_version", "the version that ran"),
    SummaryKey("config", "every setting, by section (as ``stepplan config`` shows them)"),
    SummaryKey(
        "trace",
        "the trace: its path, format, requests kept, span, rows skipped, and requests "
        "longer than ``model.max_model_len``",
        "path format requests span_s skipped rejected_max_model_len",
    ),
    SummaryKey("complete", "false when the run was stopped early (Ctrl-C, SIGTERM)"),
    SummaryKey("requests", "requests in the run"),
    SummaryKey("finished_requests", "requests that finished"),
    SummaryKey("duration_s", "first arrival to last finish, simulated seconds"),
    SummaryKey(
        "throughput",
        "finished requests and tokens per simulated second",
        "requests_per_s output_tokens_per_s total_tokens_per_s",
    ),
    SummaryKey(
        "goodput",
        "the SLOs (``ttft_ms``, ``tpot_ms``), good requests, per second and their share",
        "slo requests requests_per_s share",
    ),
    SummaryKey(
        "latency_ms",
        f"per metric, ``{{{', '.join(_STATS)}}}`` in ms (``null`` over an empty set)",
        "ttft tpot itl e2e",
    ),
    SummaryKey("itl_ms_quantiles", "101 inter-token latency quantiles, q = 0..100, in ms"),
    SummaryKey(
        "steps",
        "steps, graph hits, padding (padded share: padding / (live + padding) tokens)",
        "count graph_hits graph_hit_rate padded_tokens padded_token_share padded_rows tokens",
    ),
    SummaryKey(
        "acceptance",
        "speculative decoding: accepted drafts per spec step, acceptance length and rate",
        "mean_accepted_per_spec_step mean_acceptance_length draft_acceptance_rate "
        "spec_steps drafted_tokens accepted_tokens",
    ),
    SummaryKey(
        "time_s",
        "seconds per cost term (the columns' sums), busy (all steps) and idle",
        (*(TIME_NAMES.get(term, term) for term in COST_TERMS), "busy", "idle"),
    ),
    SummaryKey("memory", "the KV cache: budget, capacity, usage, preemptions (docs/memory.md)"),
    SummaryKey("gpu", "the GPU's figures the run used and where they came from"),
    SummaryKey("cost", "where the step times came from: profile, roofline or measured"),
    SummaryKey(
        "dollars",
        "the deployment's cost at the GPU's hourly price (``pricing.py``; ``null``: no price)",
        "price_per_gpu_hour gpus per_hour run per_million_output_tokens good_requests_per_dollar",
    ),
    SummaryKey("live", "true when a real model ran every step (``live.py``)"),
    SummaryKey("live_run", "live runs only: backend, device, dtype, time, model, graphs"),
    SummaryKey("provenance", "how to get the results again: command, version, git, trace"),
)
MEASURED_SUMMARY = (
    SummaryKey(
        "host",
        "the planner's measured time per step",
        "plan_us_p50 plan_us_p90 plan_us_mean",
    ),
    SummaryKey(
        "run", "the run's wall time and simulated steps per wall second", "wall_s steps_per_s"
    ),
    SummaryKey("live_run", "live runs only: the model's measured wall time", "model_wall_s"),
)

#: Every file a results folder may get (tables as CSV or Parquet).
RESULT_FILES = (
    *(f"{table.file[:-4]}{ext}" for table in TABLES for ext in (".csv", ".parquet")),
    "summary.json",
    "measured.json",
)
_FILES = (
    ("steps.csv", "one row per step"),
    ("requests.csv", "one row per request"),
    ("summary.json", "the run's figures and settings"),
    ("measured_steps.csv", "the measured per-step figures (vary from run to run)"),
    ("measured.json", "the measured run figures: the summary's ``measured`` section"),
    ("stepplan-manifest.json", "what stepplan wrote, by whom and when (``outdir.py``)"),
)
NOTES = (
    "``steps.csv``, ``requests.csv`` and ``summary.json`` are a function of the inputs: "
    "the same command gives byte-identical files, unless ``cost.host_cost`` or "
    "``live.time`` is ``measured`` (measured times then feed the clock). The measured "
    "files hold what varies from run to run. In memory (``SimResult``) ``plan_us`` is a "
    "column of the steps and ``measured.json`` the summary's ``measured`` section; "
    "``read_results`` puts them back there.",
    "``plan_us``: the planner's host wall time for the step: ``Planner.shape_of_rows`` on the "
    "scheduler's rows where the step's time reads only the plan's shape (no ``cost.profile``, "
    "live engine or observer; ``cost.host_cost`` not ``measured``), else building the "
    "``StepBatch`` and ``Planner.compile``. The clock reads it only with ``measured``.",
    "Throughput, goodput and latency are over the finished requests (all of them in a "
    "complete run); the step figures over the steps simulated. A request is *good* when "
    "its TTFT and TPOT meet the SLOs. ITL is the gap between consecutive steps in which a "
    "request emitted tokens.",
    "An empty cell of a float column is NaN: no TPOT for a one-token output; in a partial "
    "run (``complete`` false) no finish for the requests not finished, and no first token "
    "for those that had none.",
    'In a live run with ``live.time = "measured"``, ``model_s`` is the model run\'s '
    "measured wall time, and ``conv_s`` and ``launch_s`` are 0 (it includes them).",
    "Parquet files (``*.parquet``) replace the CSVs when asked for and ``pyarrow`` is "
    "importable. A reader renames older folders' columns (as the tables say) and keeps "
    "the columns it does not know: numbers when every cell is one, else text.",
)


# ----------------------------------------------------------------- sweeps and capacity

_LATENCY_NAMES = {"ttft": "time to first token", "tpot": "time per output token"}
_LATENCY_NAMES |= {"itl": "inter-token latency", "e2e": "end-to-end latency"}
#: A sweep point's metrics, each with the keys of its value in ``summary.json``
#: (``measured`` ones in ``measured.json``); a ``null`` there is NaN.
_SWEEP_METRICS: tuple[tuple[Column, tuple[str, ...]], ...] = (
    (Column("requests", INT, "requests", "requests in the run"), ("requests",)),
    (
        Column("finished_requests", INT, "requests", "requests that finished"),
        ("finished_requests",),
    ),
    (Column("duration_s", FLOAT, "s", "first arrival to last finish"), ("duration_s",)),
    (
        Column("throughput_req_s", FLOAT, "req/s", "finished requests per second"),
        ("throughput", "requests_per_s"),
    ),
    (
        Column("output_tok_s", FLOAT, "tokens/s", "output tokens per second"),
        ("throughput", "output_tokens_per_s"),
    ),
    (
        Column("total_tok_s", FLOAT, "tokens/s", "prompt and output tokens per second"),
        ("throughput", "total_tokens_per_s"),
    ),
    (
        Column("goodput_req_s", FLOAT, "req/s", "requests meeting the config's SLO per second"),
        ("goodput", "requests_per_s"),
    ),
    (
        Column("goodput_share", FLOAT, "", "share of requests meeting the config's SLO"),
        ("goodput", "share"),
    ),
    *(
        (
            Column(f"{name}_{stat}_ms", FLOAT, "ms", f"{stat} {meaning}"),
            ("latency_ms", name, stat),
        )
        for name, meaning in _LATENCY_NAMES.items()
        for stat in ("mean", "p50", "p90", "p99")
    ),
    (Column("steps", INT, "steps", "steps simulated"), ("steps", "count")),
    (Column("graph_hit_rate", FLOAT, "", "share of steps on a graph"), ("steps", "graph_hit_rate")),
    (
        Column("padded_token_share", FLOAT, "", "padding / (live + padding) tokens"),
        ("steps", "padded_token_share"),
    ),
    (
        Column("acceptance_length", FLOAT, "tokens", "mean accepted drafts + 1 per spec step"),
        ("acceptance", "mean_acceptance_length"),
    ),
    (Column("preemptions", INT, "", "preemptions by recompute"), ("memory", "preemptions")),
    (Column("peak_kv_usage", FLOAT, "", "peak share of KV blocks used"), ("memory", "peak_usage")),
    (
        Column("prefix_hit_rate", FLOAT, "", "share of prompt tokens the prefix cache saved"),
        ("memory", "prefix_cache_hit_rate"),
    ),
    (Column("busy_s", FLOAT, "s", "simulated time with a step running"), ("time_s", "busy")),
    *(
        (Column(name, FLOAT, unit, meaning), ("dollars", key))
        for name, unit, key, meaning in SWEEP_DOLLAR_COLUMNS
    ),
)
_SWEEP_MEASURED_METRICS = (
    (Column("wall_s", FLOAT, "s", "the point's wall time"), (MEASURED, "run", "wall_s")),
    (
        Column("steps_per_s", FLOAT, "steps/s", "simulated steps per wall second"),
        (MEASURED, "run", "steps_per_s"),
    ),
    (
        Column("plan_us_p50", FLOAT, "us", "median planner time per step"),
        (MEASURED, "host", "plan_us_p50"),
    ),
)
#: The metric columns of a sweep's table, in order, and the summary keys of each.
SWEEP_METRICS = tuple(column for column, _ in _SWEEP_METRICS)
SWEEP_PATHS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {column.name: path for column, path in _SWEEP_METRICS + _SWEEP_MEASURED_METRICS}
)
_POINT = Column("point", INT, "", "the point's number in the sweep, from 0")
_DIGEST = Column("digest", TEXT, "", "sha256 of the trace and the settings (the resume key)")
SWEEP = TableSchema(
    "sweep.csv",
    "one point of a sweep: a trace under one set of settings; after ``digest`` one column "
    "per swept setting (``scheduler.max_num_seqs``, ...), then the metrics",
    (
        _POINT,
        Column("trace", TEXT, "", "the trace's name in the sweep file"),
        _DIGEST,
        *SWEEP_METRICS,
    ),
)
SWEEP_MEASURED = TableSchema(
    "sweep_measured.csv",
    "one point's measured figures (they vary from run to run)",
    (_POINT, _DIGEST, *(column for column, _ in _SWEEP_MEASURED_METRICS)),
)
CAPACITY = TableSchema(
    "capacity.csv",
    "one request-rate scale the capacity search ran, by scale",
    (
        Column("scale", FLOAT, "", "the request-rate scale (``workload.rate_scale``)"),
        Column("round", INT, "", "the search round that ran it, from 0"),
        Column("met", INT, "", "1 when every SLO held, else 0"),
        _DIGEST,
        *SWEEP_METRICS,
    ),
)
SWEEP_TABLES = (SWEEP, SWEEP_MEASURED, CAPACITY)
_SWEEP_FILES = (
    ("sweep.csv", "one row per point (and ``sweep.parquet`` when pyarrow is installed)"),
    ("sweep_measured.csv", "each point's wall time and planner time"),
    ("sweep.json", "the sweep's trade-off: Pareto front and best point per SLO"),
    ("sweep.png", "the trade-off figure"),
    ("capacity.csv", "``stepplan capacity``: one row per rate scale it ran"),
    ("capacity.json", "``stepplan capacity``: the answer, the SLOs and the search's rounds"),
    ("capacity.png", "``stepplan capacity``: the curve that led to the answer"),
    ("points/", "one record per finished point (``<digest>.json``): what a re-run skips"),
    ("runs/", "``--keep-runs``: each point's results folder (``<digest>/``)"),
)


def _cell(text: str) -> str:
    return text.replace("``", "`").replace("|", "\\|")


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def markdown() -> str:
    """``docs/results.md``: the schema as Markdown tables."""
    lines = [
        "# Results folder",
        "",
        "What `stepplan simulate` writes (`--out`, see `sim/results/outdir.py` for what it may "
        "touch). Generated from `sim/results/schema.py` by "
        "`python -m stepplan.sim.results.schema`; edit that, not this.",
        "",
        *_table(("file", "holds"), [(f"`{name}`", meaning) for name, meaning in _FILES]),
    ]
    for table in TABLES:
        lines += [f"## {table.file}", "", f"One row: {table.meaning}.", ""]
        rows = [(f"`{c.name}`", c.dtype, c.unit, c.meaning) for c in table.columns]
        lines += _table(("column", "type", "unit", "meaning"), rows)
        for old, new in table.renamed.items():
            lines += [f"Older folders' `{old}` is read as `{new}`.", ""]
    for name, keys in (("summary.json", SUMMARY), ("measured.json", MEASURED_SUMMARY)):
        rows = [(f"`{k.name}`", k.meaning, ", ".join(f"`{n}`" for n in k.keys or ())) for k in keys]
        lines += [f"## {name}", "", *_table(("key", "meaning", "its keys"), rows)]
    lines += ["## Notes", "", *(f"- {_cell(note)}" for note in NOTES), ""]
    return "\n".join(lines + _sweep_markdown()) + "\n"


def _sweep_markdown() -> list[str]:
    """The sweep and capacity folders' section of ``docs/results.md``."""
    files = [(f"`{name}`", meaning) for name, meaning in _SWEEP_FILES]
    lines = [
        "# Sweep and capacity folders",
        "",
        "What `stepplan sweep` and `stepplan capacity` write (`sim/sweep/`).",
        "",
        *_table(("file", "holds"), files),
    ]
    for table in SWEEP_TABLES:
        lines += [f"## {table.file}", "", f"One row: {table.meaning}.", ""]
        rows = [(f"`{c.name}`", c.dtype, c.unit, c.meaning) for c in table.columns]
        lines += _table(("column", "type", "unit", "meaning"), rows)
    return lines[:-1]


if __name__ == "__main__":
    print(markdown(), end="")
