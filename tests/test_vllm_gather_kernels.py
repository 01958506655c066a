"""The builder's device half: its Triton kernels (interpreted on the CPU) write the buffer
exactly as the torch operations the CPU builder runs, for the opening group and the rest."""

from __future__ import annotations

import attrs
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_cases import STEP_DRAWS, random_step

from stepplan.executor.vllm import REVISIONS, StepShare, gather_kernels


def fresh_words(share: StepShare) -> torch.Tensor:
    """The buffer as a new share holds it: zeros, and the ramp."""
    regions = share.buffer.regions
    words = torch.zeros(regions.total, dtype=torch.int32)
    words[regions.ramp :] = torch.arange(regions.total - regions.ramp)
    words[regions.tables : regions.ramp] = share.buffer.words[regions.tables : regions.ramp]
    return words


def plain_inputs(step, group):
    """The step's engine tensors as plain CPU tensors (the interpreter copies them)."""
    table = np.stack([step.slots[group], np.zeros_like(step.slots[group])], axis=1)
    return (
        torch.tensor(table, dtype=torch.int32),
        torch.tensor(step.computed + step.q, dtype=torch.int32),
        torch.tensor(step.accepted, dtype=torch.int32),
    )


def plain_query_start(step):
    return torch.tensor(np.concatenate([[0], np.cumsum(step.q)]), dtype=torch.int32)


@settings(max_examples=60, deadline=None)
@given(
    **STEP_DRAWS,
    host_accepted=st.booleans(),
    registered=st.booleans(),
    revision=st.sampled_from(list(REVISIONS.values())),
)
def test_kernels_write_what_the_reference_writes(
    seed, rows, config, weights, host_accepted, registered, revision
):
    """Group 1 opens the step, group 0 follows; with registered tables the opening
    launch gathers every group's slots, so the last group's gather changes nothing. Under
    vLLM 0.33's rules a step without spec rows also fills the engine-ordered sources."""
    rng = np.random.default_rng(seed)
    step = random_step(rng, rows, config.query_len_max, weights, groups=3)
    share = StepShare(config, "cpu", num_groups=3, max_num_tokens=2048, revision=revision)
    tables = [plain_inputs(step, group)[0] for group in range(3)]
    if registered:
        share.register_block_tables(tables)
    table, seq_lens, accepted = plain_inputs(step, 1)
    m = step.metadata("cpu", 1)
    counts = step.accepted if host_accepted else step.device_accepted("cpu")
    speculating = config.num_spec_tokens > 0
    drafts = step.host_drafts() if speculating else None
    share.open(1, m, counts if speculating else None, drafts, None)  # group 1 opens the step
    want = share.buffer.words.clone()
    regions = share.buffer.regions
    entry = want[: regions.staged].clone()
    entry[gather_kernels.TICKET_WORD] = 1234
    done = torch.zeros(1, dtype=torch.int32)
    words = fresh_words(share)
    if not speculating:
        counts_in = None
    elif host_accepted:  # uploaded with the step, read from the buffer
        counts_in = words[regions.accepted_host : regions.accepted_host + len(step.q)]
    else:
        counts_in = accepted
    gather_kernels.open_step(
        entry, done, words, table, plain_query_start(step), seq_lens, counts_in, 1,
        config.query_len_max,
    )  # fmt: skip
    assert done.item() == 1234
    want[gather_kernels.TICKET_WORD] = 1234  # the kernel copies the ticket along with the header
    np.testing.assert_array_equal(words.numpy(), want.numpy())
    other = attrs.evolve(m, block_table_tensor=step.metadata("cpu", 0).block_table_tensor)
    share.open(0, other, counts if speculating else None, drafts, None)
    assert share.num_steps == 1
    gather_kernels.group_slots(words, tables[0], 0)
    want = share.buffer.words.clone()
    want[gather_kernels.TICKET_WORD] = 1234
    np.testing.assert_array_equal(words.numpy(), want.numpy())
    if registered:  # group 2's slots were there from the opening launch
        before = words.clone()
        gather_kernels.group_slots(words, tables[2], 2)
        assert torch.equal(words, before)


def test_the_header_words_are_distinct_and_fit():
    words = list(gather_kernels.HEADER.values())
    assert len(set(words)) == len(words)
    assert max(words) < gather_kernels.TICKET_WORD < gather_kernels.HEADER_WORDS


#: The header's plan words and the plan fields they point at (this test's reading).
PLAN_WORDS = {
    "token_map": "token_map",
    "query_start": "row_query_start",
    "kind": "row_kind",
    "state_offset": "row_state_offset",
    "reads_state": "row_reads_state",
    "accepted": "row_num_accepted",
    "request": "row_request",
    "slot": "row_slot",
}


@settings(max_examples=40, deadline=None)
@given(**STEP_DRAWS, registered=st.booleans())
def test_the_header_says_what_the_step_is(seed, rows, config, weights, registered):
    """What the kernels read from a staged step's header (the packer's summary, the
    builder's words, the fixed ones) is the step's plan: its counts, where each of its
    fields lies in the buffer (the plan's place plus the field's offset in the layout)."""
    step = random_step(np.random.default_rng(seed), rows, config.query_len_max, weights, groups=2)
    share = StepShare(config, "cpu", num_groups=2, max_num_tokens=2048)
    if registered:
        share.register_block_tables([plain_inputs(step, g)[0] for g in range(2)])
    accepted = drafts = None
    if config.num_spec_tokens:
        accepted, drafts = step.device_accepted("cpu"), step.host_drafts()
    opened = share.open(0, step.metadata("cpu"), accepted, drafts, None)
    plan, regions = opened.record.plan, share.buffer.regions
    at = gather_kernels.header_values(share.buffer.words.numpy())
    first_prefill = plan.num_spec_rows + plan.num_decode_rows
    assert (at["spec_rows"], at["first_prefill"], at["live_rows"]) == (
        plan.num_spec_rows,
        first_prefill,
        first_prefill + plan.num_prefill_rows,
    )
    assert (at["spec_tokens"], at["tokens"]) == (plan.num_spec_decode_tokens, plan.num_tokens)
    assert (at["rows"], at["size"]) == (plan.layout.num_rows, plan.layout.size)
    assert (at["gather"], at["engine_rows"]) == (opened.record.keys[3], len(step.q))
    assert (at["registered"], at["accepted_rows"]) == (2 * registered, 0)
    assert (at["plan_at"], at["accepted_host_at"]) == (regions.plan, regions.accepted_host)
    for word, field in PLAN_WORDS.items():
        assert at[word] == regions.plan + plan.layout.span(field)[0]
    token_map = share.buffer.words.numpy()[at["token_map"] :][: plan.num_tokens]
    np.testing.assert_array_equal(token_map, plan.token_map[: plan.num_tokens])
    # The record repacks the same bytes and summary (a repeated step in another entry).
    buffer = share.buffer
    plan_space, summary = buffer.spaces(None)
    staged = summary.copy()
    summary[:] = -1
    opened.record.pack(plan_space, summary)
    np.testing.assert_array_equal(summary, staged)
    np.testing.assert_array_equal(plan_space[: plan.layout.size], plan.packed)
