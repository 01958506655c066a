"""The builder's device half: its Triton kernels (interpreted on the CPU) write the buffer
exactly as the torch operations the CPU builder runs, for the opening group and the rest."""

from __future__ import annotations

import attrs
import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_cases import CONFIGS, WEIGHTS, random_step

from stepplan.executor.vllm import StepShare, door
from stepplan.planner import SUMMARY


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


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 40),
    config=st.sampled_from(CONFIGS),
    weights=WEIGHTS,
    host_accepted=st.booleans(),
    registered=st.booleans(),
)
def test_kernels_write_what_the_reference_writes(
    seed, rows, config, weights, host_accepted, registered
):
    """Group 1 opens the step, group 0 follows; with registered tables the opening
    launch gathers every group's slots, so the last group's gather changes nothing."""
    rng = np.random.default_rng(seed)
    step = random_step(rng, rows, config.query_len_max, weights, groups=3)
    share = StepShare(config, "cpu", num_groups=3, max_num_tokens=2048)
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
    entry[door.TICKET_WORD] = 1234
    done = torch.zeros(1, dtype=torch.int32)
    words = fresh_words(share)
    if not speculating:
        counts_in = None
    elif host_accepted:  # uploaded with the step, read from the buffer
        counts_in = words[regions.accepted_host : regions.accepted_host + len(step.q)]
    else:
        counts_in = accepted
    door.open_step(entry, done, words, table, seq_lens, counts_in, 1, config.query_len_max)
    assert done.item() == 1234
    want[door.TICKET_WORD] = 1234  # the kernel copies the ticket along with the header
    np.testing.assert_array_equal(words.numpy(), want.numpy())
    other = attrs.evolve(m, block_table_tensor=step.metadata("cpu", 0).block_table_tensor)
    share.open(0, other, counts if speculating else None, drafts, None)
    assert share.num_steps == 1
    door.group_slots(words, tables[0], 0)
    want = share.buffer.words.clone()
    want[door.TICKET_WORD] = 1234
    np.testing.assert_array_equal(words.numpy(), want.numpy())
    if registered:  # group 2's slots were there from the opening launch
        before = words.clone()
        door.group_slots(words, tables[2], 2)
        assert torch.equal(words, before)


def test_the_header_words_are_distinct_and_fit():
    """One meaning per word; the packer's summary first, then the builder's step words,
    then the fixed ones, all before the ticket."""
    words = list(door.HEADER.values())
    assert len(set(words)) == len(words)
    assert max(words) < door.TICKET_WORD < door.HEADER_WORDS
    assert door.HEADER["gather"] == door.SUMMARY_WORDS == len(SUMMARY)
    assert door.HEADER["plan_at"] == door.SUMMARY_WORDS + door.STEP_WORDS
