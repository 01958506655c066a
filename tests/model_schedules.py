"""Random serving schedules for the hybrid model runner, and the dense oracle's answers.

Every request has a fixed token stream (its prompt, then arbitrary tokens: schedule
invariance holds for any stream). A schedule splits each stream into prefill chunks of
any size, then decodes or spec steps whose drafts are right up to a random point and
wrong after it; rejected drafts are fed again by later steps. Several requests share
each step in a random engine order, with padding rows (``q == 0``) mixed in.

The output after a token is checked only where everything up to that token is the
stream itself: a prefill chunk's last token, a decode's token, a spec row's first
``accepted + 1`` tokens.
"""

from __future__ import annotations

import attrs
import numpy as np
import torch

from stepplan.executor.model import sample_positions
from stepplan.executor.model.dense import dense_logits
from stepplan.planner import StepBatch


@attrs.define
class Request:
    stream: np.ndarray  # [N] int64
    prompt_len: int
    slots: tuple[int, ...]  # one per layer group
    speculates: bool
    computed: int = 0
    accepted: int = 1  # tokens accepted by its previous spec step

    @property
    def done(self) -> bool:
        return self.computed >= len(self.stream)


@attrs.frozen
class Row:
    request: int
    inputs: tuple[int, ...]
    drafts: int  # -1: not spec
    accepted_drafts: int  # spec rows: drafts that are right (the rest is wrong)
    checked: int  # outputs of this row's first ``checked`` tokens are on the stream


def make_requests(
    rng: np.random.Generator, *, count: int, vocab: int, longest: int, groups: int, spec: int
) -> list[Request]:
    """``count`` requests with streams of 2..longest tokens and distinct slots per group."""
    slots = [rng.permutation(np.arange(1, count + 1)) for _ in range(groups)]
    requests = []
    for r in range(count):
        length = int(rng.integers(2, longest + 1))
        requests.append(
            Request(
                stream=rng.integers(0, vocab, length),
                prompt_len=int(rng.integers(1, length)),
                slots=tuple(int(s[r]) for s in slots),
                speculates=bool(spec and rng.random() < 0.7),
            )
        )
    return requests


def _row(
    rng: np.random.Generator, index: int, req: Request, spec: int, chunk: int, vocab: int
) -> Row:
    start = req.computed
    if start < req.prompt_len:
        q = min(req.prompt_len - start, int(rng.integers(1, chunk + 1)))
        return Row(index, tuple(req.stream[start : start + q].tolist()), -1, 0, 1)
    if not req.speculates:
        return Row(index, (int(req.stream[start]),), -1, 0, 1)
    drafts = int(rng.integers(0, min(spec, len(req.stream) - 1 - start) + 1))
    right = int(rng.integers(0, drafts + 1))
    inputs = req.stream[start : start + 1 + drafts].tolist()
    if right < drafts:  # the first wrong draft, then anything
        wrong = (inputs[1 + right] + 1 + int(rng.integers(0, vocab - 1))) % vocab
        inputs[1 + right :] = [wrong, *rng.integers(0, vocab, drafts - right - 1).tolist()]
    return Row(index, tuple(inputs), drafts, right, right + 1)


def next_step(
    rng: np.random.Generator,
    requests: list[Request],
    *,
    spec: int,
    chunk: int,
    budget: int,
    max_rows: int,
    vocab: int,
    padding_rows: bool = True,
) -> list[Row | None]:
    """The next step's rows in engine order (``None``: a padding row); empty when done."""
    live = [i for i, req in enumerate(requests) if not req.done]
    rng.shuffle(live)
    rows: list[Row | None] = []
    for index in live[:max_rows]:
        row = _row(rng, index, requests[index], spec, chunk, vocab)
        if rows and sum(len(r.inputs) for r in rows if r) + len(row.inputs) > budget:
            break
        rows.append(row)
    if padding_rows and rows:
        for _ in range(int(rng.integers(0, 3))):
            rows.insert(int(rng.integers(0, len(rows) + 1)), None)
    return rows


def batch_of(rows: list[Row | None], requests: list[Request], groups: int) -> StepBatch:
    def column(live: object, padding: object) -> list[object]:
        return [padding if row is None else live(row) for row in rows]  # type: ignore[operator]

    return StepBatch(
        query_lens=np.array(column(lambda r: len(r.inputs), 0), np.int32),
        num_computed_tokens=np.array(column(lambda r: requests[r.request].computed, 0), np.int32),
        slots=np.array(
            [column(lambda r, g=g: requests[r.request].slots[g], -1) for g in range(groups)],
            np.int32,
        ),
        num_draft_tokens=np.array(column(lambda r: r.drafts, -1), np.int32),
        num_accepted_tokens=np.array(
            column(lambda r: requests[r.request].accepted if r.drafts >= 0 else 1, 1), np.int32
        ),
    )


def advance(rows: list[Row | None], requests: list[Request]) -> None:
    """Fold the step into the requests, as an engine that accepted ``accepted_drafts``."""
    for row in rows:
        if row is None:
            continue
        req = requests[row.request]
        if row.drafts < 0:
            req.computed += len(row.inputs)
        else:
            req.computed += row.accepted_drafts + 1
            req.accepted = row.accepted_drafts + 1


def step_inputs(
    rows: list[Row | None], requests: list[Request], batch: StepBatch
) -> tuple[np.ndarray, np.ndarray, list[tuple[int, int] | None]]:
    """``token_ids``, ``sample_index`` and, per sample, ``(request, position)`` where the
    output is on the stream (else ``None``)."""
    ids = np.array([t for row in rows if row for t in row.inputs], np.int64)
    where: list[tuple[int, int] | None] = []
    for row in rows:
        if row is None:
            continue
        start = requests[row.request].computed
        where += [
            (row.request, start + i) if i < row.checked else None for i in range(len(row.inputs))
        ]
    samples = sample_positions(batch)
    return ids, samples, [where[s] for s in samples.tolist()]


def oracle(
    weights: object, shape: object, requests: list[Request]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per request ``(greedy [N], margin [N])``: the dense model's argmax after each stream
    token and its lead over the runner-up (small leads are not compared)."""
    answers = []
    for req in requests:
        logits = dense_logits(weights, shape, torch.as_tensor(req.stream)).float().cpu()  # type: ignore[arg-type]
        top = logits.topk(2, dim=-1).values
        answers.append((logits.argmax(-1).numpy(), (top[:, 0] - top[:, 1]).numpy()))
    return answers


def serve(
    runner: object, requests: list[Request], rng: np.random.Generator, **step: int
) -> list[tuple[int, int, int]]:
    """Run ``requests`` to the end through ``runner.greedy_tokens``; ``(request, position,
    greedy)`` of every checked output."""
    groups = len(requests[0].slots)
    checked = []
    while True:
        rows = next_step(rng, requests, **step)
        if not rows:
            return checked
        batch = batch_of(rows, requests, groups)
        ids, samples, where = step_inputs(rows, requests, batch)
        greedy = runner.greedy_tokens(batch, ids, samples)  # type: ignore[attr-defined]
        checked += [(*w, int(g)) for w, g in zip(where, greedy.tolist(), strict=True) if w]
        advance(rows, requests)


def mismatches(
    checked: list[tuple[int, int, int]], answers: list[tuple[np.ndarray, np.ndarray]], margin: float
) -> list[tuple[int, int, int, int]]:
    """``(request, position, runner, oracle)`` wherever they differ and the oracle's lead
    exceeds ``margin``."""
    bad = []
    for request, position, greedy in checked:
        expected, lead = answers[request]
        if greedy != expected[position] and lead[position] > margin:
            bad.append((request, position, greedy, int(expected[position])))
    return bad
