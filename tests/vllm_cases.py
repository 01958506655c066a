"""vLLM-like steps for the builder's tests: metadata with vLLM's placement, tensors that
refuse host reads, random batches, and the check of a build against ``seed_rules``."""

from __future__ import annotations

from typing import Any

import attrs
import numpy as np
import torch
from hypothesis import strategies as st
from seed_rules import PASS, seed_fields

from stepplan.planner import PlannerConfig


class HostReadError(AssertionError):
    """A device tensor was read on the host."""


def _reads_to_host(args: tuple, kwargs: dict) -> bool:
    targets = [*args[1:], kwargs.get("device")]
    return any(
        isinstance(t, (str, torch.device)) and torch.device(t).type == "cpu" for t in targets
    )


class DeviceOnly(torch.Tensor):
    """A CPU tensor that plays a device one: any read of its values on the host raises
    (``.cpu()``, ``.to("cpu")``, ``.numpy()``, ``.tolist()``, ``.item()``, ``np.asarray``,
    ``int()``, ``bool()``, printing). Torch operations on it run, as on a device."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in _HOST_READS or (name == "to" and _reads_to_host(args, kwargs)):
            raise HostReadError(f"{name}() read a device tensor on the host")
        return super().__torch_function__(func, types, args, kwargs)


_HOST_READS = {
    "cpu",
    "numpy",
    "tolist",
    "item",
    "__array__",
    "__int__",
    "__float__",
    "__bool__",
    "__index__",
    "__repr__",
    "__format__",
    "__str__",
}


def device_only(tensor: torch.Tensor, device: str) -> torch.Tensor:
    """``tensor`` on ``device``; on the CPU wrapped so that host reads raise."""
    tensor = tensor.to(device)
    return tensor.as_subclass(DeviceOnly) if device == "cpu" else tensor


@attrs.frozen
class FakeCommonMetadata:
    """The fields of vLLM 0.33's ``CommonAttentionMetadata`` the builder may touch (the
    duck-typed builder's tests; the plugin's run on vLLM's own class)."""

    query_start_loc_cpu: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    block_table_tensor: torch.Tensor
    num_reqs: int
    num_actual_tokens: int
    is_prefilling: torch.Tensor | None = None
    seq_lens_cpu_upper_bound: torch.Tensor | None = None

    def compute_num_computed_tokens(self) -> torch.Tensor:
        return self.seq_lens - torch.diff(self.query_start_loc)


@attrs.frozen
class Step:
    """One step as per-row numpy arrays (the truth) and how the engine hands it over."""

    q: np.ndarray
    computed: np.ndarray
    slots: np.ndarray  # [G, R]: one block table column 0 per layer group
    drafts: np.ndarray
    accepted: np.ndarray
    extra_tokens: int
    prefilling: np.ndarray | None = None  # [R] bool: a prompt chunk (vLLM's is_prefilling)

    def metadata(self, device: str, group: int = 0) -> FakeCommonMetadata:
        starts = torch.tensor(np.concatenate([[0], np.cumsum(self.q)]), dtype=torch.int32)
        table = np.stack([self.slots[group], np.full_like(self.slots[group], 99)], axis=1)
        return FakeCommonMetadata(
            query_start_loc_cpu=starts,
            query_start_loc=device_only(starts, device),
            seq_lens=device_only(torch.tensor(self.computed + self.q, dtype=torch.int32), device),
            block_table_tensor=device_only(torch.tensor(table, dtype=torch.int32), device),
            num_reqs=len(self.q),
            num_actual_tokens=int(self.q.sum()) + self.extra_tokens,
            is_prefilling=torch.tensor(
                np.zeros(len(self.q), bool) if self.prefilling is None else self.prefilling
            ),
            seq_lens_cpu_upper_bound=torch.tensor(self.computed + self.q, dtype=torch.int32),
        )

    def host_drafts(self) -> torch.Tensor:
        return torch.tensor(self.drafts, dtype=torch.int32)

    def device_accepted(self, device: str) -> torch.Tensor:
        return device_only(torch.tensor(self.accepted, dtype=torch.int32), device)


def random_step(rng: np.random.Generator, rows: int, q_max: int, weights, groups: int = 1) -> Step:
    """Rows of the kinds (spec, decode, prefill, zero-length) drawn with ``weights``, then
    0-3 trailing zero-length rows (graph padding) and 0-4 padded tokens."""
    kinds = rng.choice(4, size=rows, p=np.array(weights) / sum(weights))
    kinds = np.concatenate([kinds, np.full(int(rng.integers(0, 4)), 3)])
    rows = len(kinds)
    q = np.choose(
        kinds,
        [
            1 + rng.integers(0, q_max, rows),
            np.ones(rows, int),
            rng.integers(2, 30, rows),
            0 * kinds,
        ],
    ).astype(np.int32)
    computed = (rng.integers(0, 30, rows) * (rng.random(rows) < 0.6)).astype(np.int32)
    computed = np.where(kinds == 0, computed + 1, np.where(kinds == 3, 0, computed))
    slots = np.stack([rng.permutation(np.arange(1, rows + 1)) for _ in range(groups)])
    slots = np.where(kinds == 3, -1, slots).astype(np.int32)  # vLLM marks padding rows -1
    drafts = np.where(kinds == 0, q - 1, -1).astype(np.int32)
    accepted = rng.integers(1, q_max + 1, rows).astype(np.int32)
    extra = int(rng.integers(0, 5))
    # Prompt chunks among the plain rows, drawn apart: the caller's draws stay as they were.
    apart = np.random.default_rng(rng.bit_generator.seed_seq.spawn(1)[0])
    prefilling = ((kinds == 1) | (kinds == 2)) & (apart.random(rows) < 0.5)
    return Step(q, computed, slots, drafts, accepted, extra, prefilling)


WEIGHTS = st.sampled_from(
    [(1, 0, 0, 0), (1, 0, 0, 1), (0, 1, 0, 0), (0, 1, 0, 1), (0, 0, 1, 0), (1, 1, 0, 0),
     (1, 0, 1, 0), (0, 1, 1, 0), (1, 1, 1, 0), (7, 6, 4, 3)]
)  # fmt: skip
CONFIGS = [
    PlannerConfig(
        num_spec_tokens=spec, graph_mode=mode, max_num_seqs=48, graph_sizes=(1, 2, 4, 8, 16, 32, 64)
    )
    for spec in (3, 1)
    for mode in ("full", "mixed", "none")
] + [
    PlannerConfig(num_spec_tokens=0, graph_mode=mode, max_num_seqs=48) for mode in ("full", "none")
]


#: ``@given(**STEP_DRAWS)``: what ``random_step`` and a config are drawn from.
STEP_DRAWS = dict(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 40),
    config=st.sampled_from(CONFIGS),
    weights=WEIGHTS,
)


def expected(step: Step, config: PlannerConfig, group: int = 0, *, capture: bool = False) -> dict:
    """``seed_rules.seed_fields`` of ``step`` for ``group`` (a capture build: every row with
    tokens a spec row with all of them accepted, when the config speculates)."""
    drafts, accepted = step.drafts, step.accepted
    if capture:
        drafts, accepted = step.q - 1, step.q
    return seed_fields(
        step.q,
        drafts,
        accepted,
        step.computed + step.q,
        step.slots[group],
        int(step.q.sum()) + step.extra_tokens,
        num_spec=config.num_spec_tokens,
        full_graphs=config.graph_mode != "none",
        capture_sizes=config.sizes,
        max_num_seqs=config.max_num_seqs,
    )


_DTYPES = {
    np.dtype(np.int32): torch.int32,
    np.dtype(np.int64): torch.int64,
    np.dtype(bool): torch.bool,
}


def assert_seed_exact(md: Any, want: dict, m: FakeCommonMetadata, drafts: Any, device: str) -> None:
    """Every seed field of ``md`` has the rules' value, shape, dtype and device; ``None``
    exactly where they leave it unset; the engine's own tensors passed on as they are."""
    skip = {"plan_record", "plan_buffer", "group", "step"}
    for name in md._fields:
        got = getattr(md, name)
        if name in skip:
            continue
        value = want.get(name)
        if value is PASS:
            own = {
                "query_start_loc": m.query_start_loc,
                "non_spec_query_start_loc": m.query_start_loc,
                "seq_lens": m.seq_lens,
                "num_decode_draft_tokens_cpu": drafts,
            }[name]
            assert got is own, name
        elif value is None or isinstance(value, int):
            assert got == value if value is not None else got is None, (name, got, value)
        else:
            assert isinstance(got, torch.Tensor), (name, got)
            assert got.device.type == torch.device(device).type, name
            assert got.dtype == _DTYPES[value.dtype], (name, got.dtype, value.dtype)
            assert tuple(got.shape) == value.shape, (name, tuple(got.shape), value.shape)
            host = got.cpu().numpy()
            np.testing.assert_array_equal(host, value, err_msg=name)
