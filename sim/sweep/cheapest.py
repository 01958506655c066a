"""The cheapest deployment that meets the SLOs (``stepplan capacity --find cheapest``).

The grid is GPU preset x tensor-parallel ranks x co-located or disaggregated; for each
candidate the replica search (``replica_search.py``) finds the fewest replicas that meet
the SLOs at the settings' rate, and that deployment's price per hour (``pricing.py``:
GPUs = replicas x ranks) is its cost. A disaggregated candidate of ``n`` replicas is a
prefill pool and a decode pool of ``n`` replicas each of that GPU and ranks (the search
grows both together, 1:1), its GPUs ``2 x n x ranks``, the state crossing
``disaggregation.link``. The answer is the cheapest pair that met the SLOs (ties: fewer
GPUs, then more goodput, then the grid's order). A pair that cannot run (the ranks do not split the
model, the weights leave no cache) is refused with its reason, not searched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import attrs
import numpy as np

from ..results.schema import FLOAT, INT, TEXT, Column, TableSchema
from ..settings.config_parallel import MAX_TENSOR_RANKS
from ..settings.gpus import find_preset
from .search import SearchError

#: ``capacity.csv`` of ``--find cheapest``: one row per pair, the front and answer marked.
CHEAPEST = TableSchema(
    "capacity.csv",
    "one GPU preset at one tensor-parallel size the cheapest-deployment search tried",
    (
        Column("gpu", TEXT, "", "the GPU preset (``gpu.name``)"),
        Column("tensor", INT, "ranks", "tensor-parallel ranks per replica"),
        Column(
            "disaggregated",
            INT,
            "",
            "1: a prefill pool and a decode pool of `replicas` each; 0: co-located",
        ),
        Column("replicas", INT, "", "the fewest replicas that met the SLOs; 0: none did"),
        Column("gpus", INT, "", "replicas x tensor (x 2 disaggregated)"),
        Column("usd_per_hour", FLOAT, "$/h", "the deployment's GPUs per hour"),
        Column("goodput_req_s", FLOAT, "req/s", "requests meeting the config's SLO per second"),
        Column("ttft_p99_ms", FLOAT, "ms", "p99 time to first token"),
        Column("tpot_p99_ms", FLOAT, "ms", "p99 time per output token"),
        Column("met", INT, "", "1 when a replica count met every SLO, else 0"),
        Column("pareto", INT, "", "1 on the front of cost against goodput, else 0"),
        Column("cheapest", INT, "", "1 for the answer, else 0"),
        Column("refused", TEXT, "", "why the pair cannot run; empty when it ran"),
    ),
)
#: What ``--gpus``, ``--tensor`` and ``--disaggregation`` mean unset.
DEFAULT_GPUS, DEFAULT_TENSOR, DEFAULT_LAYOUTS = "H100,H200,A100", "1,2,4", "off"
#: ``--disaggregation``'s words: co-located (off) or a prefill pool apart (on).
LAYOUT_WORDS = {"off": False, "on": True}
#: Most replica-count runs a search may plan (pairs x the replica search's rounds).
MAX_RUNS = 4096


@attrs.frozen
class Candidate:
    """One GPU preset at one tensor-parallel size, and what its search found.

    Attributes:
        gpu: the preset's name. tensor: ranks per replica.
        replicas: the fewest replicas that met the SLOs (``None``: none did, or refused).
        usd_per_hour: the deployment's price at ``replicas`` (``None`` without one).
        goodput_req_s, ttft_p99_ms, tpot_p99_ms: that run's figures (NaN without one).
        refused: why the pair cannot run (empty when it ran).
        disaggregated: a prefill pool and a decode pool of ``replicas`` each.
    """

    gpu: str
    tensor: int
    replicas: int | None = None
    usd_per_hour: float | None = None
    goodput_req_s: float = math.nan
    ttft_p99_ms: float = math.nan
    tpot_p99_ms: float = math.nan
    refused: str = ""
    disaggregated: bool = False

    @property
    def gpus(self) -> int:
        """GPUs the deployment holds (0 without a count that met the SLOs)."""
        pools = 2 if self.disaggregated else 1
        return 0 if self.replicas is None else self.replicas * self.tensor * pools

    @property
    def met(self) -> bool:
        """Whether some replica count met the SLOs (and its price is known)."""
        return self.replicas is not None and self.usd_per_hour is not None


def parse_gpus(text: str) -> tuple[str, ...]:
    """``--gpus H100,H200``: preset names, each known and named once."""
    names = tuple(part.strip() for part in text.split(","))
    found = []
    for name in names:
        try:
            preset = find_preset(name)
        except KeyError as exc:
            raise SearchError(f"--gpus: {exc.args[0]}") from None
        if preset is None:
            raise SearchError(f"--gpus: {name!r} has no price; name presets")
        found.append(preset.name)
    if len(set(found)) != len(found):
        raise SearchError(f"--gpus: {text!r} names a GPU twice")
    return tuple(found)


def parse_tensors(text: str) -> tuple[int, ...]:
    """``--tensor 1,2,4``: tensor-parallel sizes from 1 to ``MAX_TENSOR_RANKS``, once each."""
    sizes = []
    for part in text.split(","):
        try:
            size = int(part.strip())
        except ValueError:
            raise SearchError(f"--tensor: {part.strip()!r} is not a whole number") from None
        if not 1 <= size <= MAX_TENSOR_RANKS:
            raise SearchError(f"--tensor: {size} must be 1 to {MAX_TENSOR_RANKS}")
        sizes.append(size)
    if len(set(sizes)) != len(sizes):
        raise SearchError(f"--tensor: {text!r} names a size twice")
    return tuple(sizes)


def parse_layouts(text: str) -> tuple[bool, ...]:
    """``--disaggregation off,on``: co-located (off), disaggregated (on), once each."""
    words = tuple(part.strip() for part in text.split(","))
    for word in words:
        if word not in LAYOUT_WORDS:
            raise SearchError(f"--disaggregation: {word!r} is not one of off, on")
    if len(set(words)) != len(words):
        raise SearchError(f"--disaggregation: {text!r} names a value twice")
    return tuple(LAYOUT_WORDS[word] for word in words)


def search_runs(pairs: int, most: int) -> int:
    """At most how many runs the search plans: each pair doubles up to ``most`` then
    bisects back, ``2 * ceil(log2(most)) + 1`` counts at most."""
    return pairs * (2 * math.ceil(math.log2(max(most, 1))) + 1)


def check_grid(
    gpus: Sequence[str], tensors: Sequence[int], most: int, layouts: Sequence[bool] = (False,)
) -> None:
    """Refuse a grid whose searches could plan more than ``MAX_RUNS`` runs."""
    pairs = len(gpus) * len(tensors) * len(layouts)
    runs = search_runs(pairs, most)
    if runs > MAX_RUNS:
        raise SearchError(
            f"--gpus x --tensor x --disaggregation x --max-replicas: {pairs} candidates could "
            f"run up to {runs:,} replica counts, more than {MAX_RUNS:,}; narrow the grid"
        )


def pareto_front(cost: np.ndarray, goodput: np.ndarray) -> np.ndarray:
    """Which points no other beats: none costs no more with at least the goodput and is
    better in one. ``cost``, ``goodput``: [points] float64; NaN points are off the front.
    Returns [points] bool."""
    ok = ~(np.isnan(cost) | np.isnan(goodput))
    front = ok.copy()
    for i in np.flatnonzero(ok):
        others = ok & (cost <= cost[i]) & (goodput >= goodput[i])
        better = others & ((cost < cost[i]) | (goodput > goodput[i]))
        front[i] = not better.any()
    return front


def cheapest(candidates: Sequence[Candidate]) -> Candidate | None:
    """The cheapest candidate that met the SLOs (ties: fewer GPUs, then more goodput, so
    the answer is on the front; then listed first)."""
    met = [(c.usd_per_hour, c.gpus, -c.goodput_req_s, i) for i, c in enumerate(candidates) if c.met]
    return candidates[min(met)[3]] if met else None
