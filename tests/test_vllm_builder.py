"""The vLLM builder drop-in: the seed's fields exactly, from host data alone, one compile per
step for every layer group (the device half runs as torch operations on the CPU; its
Triton kernels are checked against them in ``test_vllm_gather_kernels.py``)."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from vllm_cases import (
    CONFIGS,
    WEIGHTS,
    HostReadError,
    assert_seed_exact,
    device_only,
    expected,
    random_step,
)

from stepplan.executor.vllm import (
    PlanMetadataBuilder,
    StepShare,
    device_buffer,
    host_array,
    host_inputs,
    plan_from_common_metadata,
    vllm_split,
)
from stepplan.planner import (
    PlanError,
    Planner,
    PlannerConfig,
    StepBatch,
    compile_plan,
    host_ints,
)


def full_plan(step, config):
    """The oracle: the plan compiled from every field on the host, all groups' slots."""
    batch = StepBatch(
        query_lens=step.q,
        num_computed_tokens=step.computed,
        slots=np.where(step.q > 0, step.slots, 0),
        num_draft_tokens=step.drafts if config.num_spec_tokens else np.full(len(step.q), -1),
        num_accepted_tokens=step.accepted,
        num_padded_tokens=int(step.q.sum()) + step.extra_tokens,
        allow_null_slots=True,
    )
    return compile_plan(batch, config)


def test_device_only_tensors_refuse_every_host_read():
    """The tests' device tensors fail when read on the host, and the old reading fails."""
    t = device_only(torch.arange(4, dtype=torch.int32), "cpu")
    reads = [
        t.cpu,
        t.numpy,
        t.tolist,
        lambda: t[0].item(),
        lambda: np.asarray(t),
        lambda: int(t[0]),
        lambda: bool(t[0]),
        lambda: t.to("cpu"),
        lambda: repr(t),
        lambda: host_array(t),
    ]
    for read in reads:
        with pytest.raises(HostReadError):
            read()
    doubled = t.index_select(0, torch.tensor([1, 3])) * 2  # device operations run
    assert torch.equal(doubled.as_subclass(torch.Tensor), torch.tensor([2, 6], dtype=torch.int32))
    step = random_step(np.random.default_rng(0), 5, 4, (1, 1, 1, 0))
    with pytest.raises(HostReadError):
        plan_from_common_metadata(
            step.metadata("cpu"),
            num_accepted_tokens=step.device_accepted("cpu"),
            num_decode_draft_tokens_cpu=step.host_drafts(),
            config=CONFIGS[0],
        )


@settings(max_examples=400, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 40),
    config=st.sampled_from(CONFIGS),
    weights=WEIGHTS,
)
def test_build_is_seed_exact_from_host_data_alone(seed, rows, config, weights):
    """Every field as the seed's rules give it, with device inputs never read on the host;
    the device plan equals the plan compiled with every field read on the host."""
    rng = np.random.default_rng(seed)
    step = random_step(rng, rows, config.query_len_max, weights)
    if not (step.q > 0).any():
        return  # no live row: the seed refuses such a step (an assert)
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    m, drafts = step.metadata("cpu"), step.host_drafts()
    md = builder.build(
        0, m, num_accepted_tokens=step.device_accepted("cpu"), num_decode_draft_tokens_cpu=drafts
    )
    assert_seed_exact(md, expected(step, config), m, drafts, "cpu")
    np.testing.assert_array_equal(md.plan_buffer.numpy(), full_plan(step, config).packed)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    rows=st.integers(1, 32),
    config=st.sampled_from(CONFIGS),
    trailing=st.integers(0, 3),
)
def test_capture_build_is_seed_exact(seed, rows, config, trailing):
    """``build_for_cudagraph_capture``: uniform rows, every row a fully accepted spec row
    when the config speculates (trailing zero-length rows stay padding)."""
    rng = np.random.default_rng(seed)
    spec = config.num_spec_tokens > 0
    q = rng.integers(1, config.query_len_max + 1, rows) if spec else np.ones(rows, int)
    q = np.concatenate([q, np.zeros(trailing, int)]).astype(np.int32)
    drawn = random_step(rng, len(q), config.query_len_max, (1, 0, 0, 0))
    slots = np.where(q > 0, drawn.slots[:, : len(q)], -1)
    step = type(drawn)(q, drawn.computed[: len(q)], slots, q - 1, q, 0)
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    m = step.metadata("cpu")
    if len(q) > builder.decode_cudagraph_max_bs or q.sum() > builder.decode_cudagraph_max_tokens:
        with pytest.raises(ValueError, match="full graphs are captured for at most"):
            builder.build_for_cudagraph_capture(m)
        return
    md = builder.build_for_cudagraph_capture(m)
    want = expected(step, config, capture=True)
    drafts = md.num_decode_draft_tokens_cpu
    if spec:
        assert drafts.dtype == torch.int32 and drafts.tolist() == (q - 1).tolist()
    else:
        assert drafts is None
    assert_seed_exact(md, want, m, drafts, "cpu")


def make_builders(config, groups, **share_options):
    share = StepShare(config, "cpu", num_groups=groups, max_num_tokens=2048, **share_options)
    return share, [PlanMetadataBuilder(config, "cpu", share=share, group=g) for g in range(groups)]


def build_step(builders, step, **options):
    """Every group's build of one step, each with its own block table (as vLLM hands them)."""
    drafts, accepted = step.host_drafts(), step.device_accepted("cpu")
    first = step.metadata("cpu")
    results = []
    for group, builder in enumerate(builders):
        m = step.metadata("cpu", group)
        # The shared fields are the first group's objects; vLLM may also slice them anew.
        m = type(m)(
            first.query_start_loc_cpu,
            first.query_start_loc,
            first.seq_lens,
            m.block_table_tensor,
            m.num_reqs,
            m.num_actual_tokens,
        )
        md = builder.build(
            0, m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts, **options
        )
        results.append((md, m, drafts))
    return results


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), groups=st.integers(2, 4), config=st.sampled_from(CONFIGS))
def test_one_compile_serves_every_group_of_a_step(seed, groups, config):
    rng = np.random.default_rng(seed)
    share, builders = make_builders(config, groups)
    compiles = []  # the builds' plans: packed from host data, no plan made
    pack = share._planner.pack_host_step
    share._planner.pack_host_step = lambda *args, **kw: compiles.append(1) or pack(*args, **kw)
    for _ in range(3):
        step = random_step(
            rng, int(rng.integers(1, 30)), config.query_len_max, (7, 6, 4, 3), groups
        )
        if not (step.q > 0).any():
            continue
        results = build_step(builders, step)
        assert len(compiles) == share.num_compiles <= share.num_steps
        assert {md.step for md, _, _ in results} == {share.num_steps}
        for group, (md, _, _) in enumerate(results):
            assert md.plan is results[0][0].plan and md.group == group
        for group, (md, m, drafts) in enumerate(results):  # each group keeps its own slots
            assert_seed_exact(md, expected(step, config, group), m, drafts, "cpu")
        np.testing.assert_array_equal(
            results[-1][0].plan_buffer.numpy(), full_plan(step, config).packed
        )
    assert len(compiles) <= 3


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(CONFIGS))
def test_a_repeated_plan_serves_steps_of_new_device_values(seed, config):
    """Steps A, B, A, A, A: the host data of A recur (its plan is reused and its entry
    kept, not rewritten) while its slots, computed tokens and accepted counts change; every
    build stays seed-exact."""
    rng = np.random.default_rng(seed)
    share, builders = make_builders(config, 2)
    first = random_step(rng, int(rng.integers(1, 30)), config.query_len_max, (7, 6, 4, 3), 2)
    other = random_step(rng, int(rng.integers(1, 30)), config.query_len_max, (7, 6, 4, 3), 2)
    assume((first.q > 0).any() and (other.q > 0).any())
    headers = []

    class CountingWords:  # the builder's header words, counted as they are written
        def pack_into(self, *args):
            headers.append(1)
            words.pack_into(*args)

    words, device_buffer._STEP_WORDS = device_buffer._STEP_WORDS, CountingWords()
    try:
        compiles, written = _repeat_plans(rng, config, share, builders, first, other, headers)
    finally:
        device_buffer._STEP_WORDS = words
    same = np.array_equal(first.q, other.q) and np.array_equal(first.drafts, other.drafts)
    assert compiles[2:] == [compiles[2]] * 3 and (same or compiles[:3] == [1, 2, 3])
    # The CPU buffer has one entry: A's third and later steps find it holding A's plan.
    assert written[2:] == [written[2]] * 3 and (same or written[:3] == [1, 2, 3])


def _repeat_plans(rng, config, share, builders, first, other, headers):
    """Steps A, B, A, A, A with new device values each; compiles and header writes after
    each step."""
    compiles, written = [], []
    for step in (first, other, first, first, first):
        rows = len(step.q)
        step = attrs.evolve(
            step,
            slots=rng.permutation(np.arange(1, 2 * rows + 1, dtype=np.int32)).reshape(2, rows),
            computed=rng.integers(0, 50, rows).astype(np.int32),
            accepted=rng.integers(1, config.query_len_max + 1, rows).astype(np.int32),
        )
        for group, (md, m, drafts) in enumerate(build_step(builders, step)):
            assert_seed_exact(md, expected(step, config, group), m, drafts, "cpu")
        compiles.append(share.num_compiles)
        written.append(len(headers))
        np.testing.assert_array_equal(md.plan_buffer.numpy(), full_plan(step, config).packed)
    return compiles, written


def test_a_step_is_recognized_by_its_inputs():
    config = CONFIGS[0]
    share, builders = make_builders(config, 2)
    step = random_step(np.random.default_rng(3), 12, 4, (7, 6, 4, 3), 2)
    build_step(builders, step)
    assert share.num_steps == 1
    build_step(builders, step)  # the same inputs again: group 0 built already, so a new step
    assert share.num_steps == 2
    first = step.metadata("cpu")
    drafts, accepted = step.host_drafts(), step.device_accepted("cpu")
    kwargs = dict(num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts)
    builders[0].build(0, first, **kwargs)
    assert share.num_steps == 3
    # A fresh view of the same memory (vLLM slicing its buffers anew per group) is the step's.
    resliced = type(first)(
        first.query_start_loc_cpu.clone(),
        first.query_start_loc[:],
        first.seq_lens[:],
        step.metadata("cpu", 1).block_table_tensor,
        first.num_reqs,
        first.num_actual_tokens,
    )
    builders[1].build(
        0, resliced, num_accepted_tokens=accepted[:], num_decode_draft_tokens_cpu=drafts
    )
    assert share.num_steps == 3
    # Other device memory, or other host values, make a new step.
    builders[0].build(0, first, **kwargs)
    other = type(first)(*[getattr(first, n) for n in ("query_start_loc_cpu", "query_start_loc")],
                        first.seq_lens.clone(), *[getattr(first, n) for n in
                        ("block_table_tensor", "num_reqs", "num_actual_tokens")])  # fmt: skip
    builders[1].build(0, other, **kwargs)
    assert share.num_steps == 5
    builders[0].build(0, first, **kwargs)
    first.query_start_loc_cpu[-1] += 1  # changed in place between two groups' builds
    first.query_start_loc_cpu[-1] -= 1
    builders[1].build(
        0, first, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts + 0
    )
    assert share.num_steps == 6  # equal contents: still the step
    share.new_step()
    builders[1].build(0, first, **kwargs)
    assert share.num_steps == 7
    share.new_step()
    builders[0].build(0, first, **kwargs)
    first.query_start_loc_cpu.add_(1)  # other contents in place (the same tensor): a new step
    builders[1].build(0, first, **kwargs)
    assert share.num_steps == 9
    first.query_start_loc_cpu.sub_(1)
    # Other accepted counts (other device memory, or other host values): a new step.
    builders[0].build(0, first, **kwargs)
    builders[1].build(
        0, first, num_accepted_tokens=accepted.clone(), num_decode_draft_tokens_cpu=drafts
    )
    assert share.num_steps == 11
    on_host = step.accepted.astype(np.int32)
    builders[0].build(0, first, num_accepted_tokens=on_host, num_decode_draft_tokens_cpu=drafts)
    builders[1].build(
        0, first, num_accepted_tokens=on_host.copy(), num_decode_draft_tokens_cpu=drafts
    )
    assert share.num_steps == 12  # equal host values: the step
    builders[0].build(0, first, num_accepted_tokens=on_host, num_decode_draft_tokens_cpu=drafts)
    builders[1].build(
        0, first, num_accepted_tokens=on_host % 2 + 1, num_decode_draft_tokens_cpu=drafts
    )
    assert share.num_steps == 14
    builders[0].build(0, first, **kwargs)  # the same tensors, other padded tokens: a new step
    builders[1].build(
        0, attrs.evolve(first, num_actual_tokens=first.num_actual_tokens + 8), **kwargs
    )
    assert share.num_steps == 16


def test_step_ids_make_steps_explicit():
    config = CONFIGS[0]
    share, builders = make_builders(config, 3)
    rng = np.random.default_rng(5)
    step = random_step(rng, 10, 4, (7, 6, 4, 3), 3)
    build_step(builders, step, step_id=7)
    assert share.num_steps == 1
    build_step(builders[:1], step, step_id=8)
    assert share.num_steps == 2
    other = random_step(rng, 9, 4, (7, 6, 4, 3), 3)
    m = other.metadata("cpu", 1)
    with pytest.raises(ValueError, match="step_id 8: a further layer group got other inputs"):
        builders[1].build(
            0,
            m,
            num_accepted_tokens=other.device_accepted("cpu"),
            num_decode_draft_tokens_cpu=other.host_drafts(),
            step_id=8,
        )


def test_fields_keep_their_addresses_across_steps():
    """A CUDA graph captured over one step's metadata reads the next step's values: the
    plan and the fields the seed keeps in persistent buffers for its graphs (pure spec,
    pure decode batches) stay where they were."""
    config = CONFIGS[0]
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    rng = np.random.default_rng(7)
    persistent = {
        (1, 0, 0, 1): ("spec_state_indices_tensor", "num_accepted_tokens",
                       "spec_query_start_loc", "spec_sequence_masks"),
        (0, 1, 0, 0): ("has_initial_states_d", "state_indices_tensor_d"),
        (7, 6, 4, 3): (),
    }  # fmt: skip
    seen: dict[str, int] = {}
    for rows in (30, 4, 17, 1, 25, 8):
        for weights, names in persistent.items():
            step = random_step(rng, rows, 4, weights)
            md = builder.build(
                0,
                step.metadata("cpu"),
                num_accepted_tokens=step.device_accepted("cpu"),
                num_decode_draft_tokens_cpu=step.host_drafts(),
            )
            for name in ("plan_buffer", *names):
                address = getattr(md, name).data_ptr()
                assert seen.setdefault(name, address) == address, name
    assert len(seen) == 7


def test_accepted_counts_may_come_from_the_host():
    config = CONFIGS[0]
    step = random_step(np.random.default_rng(11), 20, 4, (7, 6, 4, 3))
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    m, drafts = step.metadata("cpu"), step.host_drafts()
    md = builder.build(0, m, num_accepted_tokens=step.accepted, num_decode_draft_tokens_cpu=drafts)
    assert_seed_exact(md, expected(step, config), m, drafts, "cpu")
    np.testing.assert_array_equal(md.plan_buffer.numpy(), full_plan(step, config).packed)


@pytest.mark.parametrize(
    "form",
    [
        lambda t: t.to(torch.int64),
        lambda t: t.numpy().copy(),
        lambda t: t.tolist(),
        lambda t: torch.stack([t, t + 100], dim=1)[:, 0],  # a strided view
        lambda t: torch.cat([t, torch.full((5,), 77, dtype=t.dtype)]),  # entries past the rows
    ],
    ids=["int64", "numpy", "list", "strided", "longer"],
)
def test_host_data_in_any_form_give_the_int32_tensors_step(form):
    """Host inputs are read by value: another dtype, container or memory layout (and
    entries past the rows) give the same fields as the contiguous int32 tensors."""
    config = CONFIGS[0]
    step = random_step(np.random.default_rng(12), 24, 4, (7, 6, 4, 3))
    m, drafts = step.metadata("cpu"), step.host_drafts()
    accepted = step.device_accepted("cpu")
    want = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048).build(
        0, m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts
    )
    other, other_drafts = (
        attrs.evolve(m, query_start_loc_cpu=form(m.query_start_loc_cpu)),
        form(drafts),
    )
    got = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048).build(
        0, other, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=other_drafts
    )
    assert_seed_exact(got, expected(step, config), other, other_drafts, "cpu")
    np.testing.assert_array_equal(got.plan_buffer.numpy(), want.plan_buffer.numpy())
    assert got.plan == want.plan


def test_bad_input_is_one_clear_error():
    config = PlannerConfig(num_spec_tokens=3, graph_mode="none", max_num_seqs=4, graph_sizes=[4])
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=16)
    rng = np.random.default_rng(1)
    step = random_step(rng, 5, 4, (0, 1, 0, 0))
    with pytest.raises(ValueError, match=r"num_reqs: .* exceeds the builder's max_num_reqs = 4"):
        builder.build(0, step.metadata("cpu"))
    long = random_step(rng, 1, 4, (0, 0, 1, 0))
    long = type(long)(np.array([100], np.int32), *[getattr(long, n) for n in
                      ("computed", "slots", "drafts", "accepted")], 0)  # fmt: skip
    with pytest.raises(ValueError, match="raise max_num_tokens"):
        builder.build(0, long.metadata("cpu"))
    share = StepShare(config, "cpu", num_groups=2)
    PlanMetadataBuilder(config, "cpu", share=share, group=1)
    with pytest.raises(ValueError, match="group: 1 already has a builder"):
        PlanMetadataBuilder(config, "cpu", share=share, group=1)
    with pytest.raises(ValueError, match=r"group: must be in 0\.\.1, got 2"):
        PlanMetadataBuilder(config, "cpu", share=share, group=2)
    with pytest.raises(ValueError, match="share: was made for another PlannerConfig"):
        PlanMetadataBuilder(CONFIGS[1], "cpu", share=share)
    with pytest.raises(ValueError, match="set them on the StepShare"):
        PlanMetadataBuilder(config, "cpu", share=share, max_num_tokens=64)


def test_bad_host_data_is_refused_naming_the_field():
    config = CONFIGS[0]
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    step = random_step(np.random.default_rng(3), 6, 4, (1, 1, 1, 0))
    m, drafts = step.metadata("cpu"), step.host_drafts()
    short = attrs.evolve(m, query_start_loc_cpu=m.query_start_loc_cpu[:-2])
    with pytest.raises(ValueError, match=r"query_start_loc_cpu: \d+ entries, num_reqs \+ 1 ="):
        builder.build(0, short, num_decode_draft_tokens_cpu=drafts)
    with pytest.raises(ValueError, match=r"num_decode_draft_tokens_cpu: \d+ entries, num_reqs ="):
        builder.build(0, m, num_decode_draft_tokens_cpu=drafts[:-1])
    paired = attrs.evolve(m, query_start_loc_cpu=torch.stack([m.query_start_loc_cpu] * 2, 1))
    with pytest.raises(ValueError, match=r"query_start_loc_cpu: must be 1-D, got shape \[\d+, 2\]"):
        builder.build(0, paired, num_decode_draft_tokens_cpu=drafts)
    with pytest.raises(ValueError, match=r"num_decode_draft_tokens_cpu: must be 1-D"):
        builder.build(0, m, num_decode_draft_tokens_cpu=drafts[None])
    backwards = m.query_start_loc_cpu.clone()
    backwards[2] = backwards[1] - 1  # row 1 would have a negative length
    with pytest.raises(PlanError, match=r"^query_lens\[1\]: must be >= 0"):
        builder.build(0, attrs.evolve(m, query_start_loc_cpu=backwards))
    wrong = drafts.clone()
    wrong[step.drafts.argmax()] += 1  # a spec row whose drafts do not match its tokens
    with pytest.raises(PlanError, match=r"^query_lens\[\d+\]: spec row must schedule"):
        builder.build(0, m, num_decode_draft_tokens_cpu=wrong)


def test_host_fields_must_be_on_the_host():
    """Tensors the builder reads on the host must be there (a meta tensor stands in for a
    device one: reading it fails as reading a device one would wait)."""
    config = CONFIGS[0]
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    step = random_step(np.random.default_rng(2), 6, 4, (1, 1, 0, 0))
    m = step.metadata("cpu")
    on_device = step.host_drafts().to("meta")
    with pytest.raises(ValueError, match="num_decode_draft_tokens_cpu: must be on the host, got a"):
        builder.build(0, m, num_decode_draft_tokens_cpu=on_device)
    bad = attrs.evolve(m, query_start_loc_cpu=m.query_start_loc_cpu.to("meta"))
    with pytest.raises(ValueError, match="query_start_loc_cpu: must be on the host, got a tensor"):
        builder.build(0, bad)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), config=st.sampled_from(CONFIGS))
def test_registered_block_tables_spare_the_further_launches(seed, config):
    """With the engine's tables registered, the opening launch gathers every group's
    slots: the further builds launch nothing and their fields are still the seed's."""
    rng = np.random.default_rng(seed)
    share, builders = make_builders(config, 3)
    persistent = [device_only(torch.zeros(64, 2, dtype=torch.int32), "cpu") for _ in range(3)]
    share.register_block_tables(persistent)
    launches = []
    slots = share.buffer.slots
    share.buffer.slots = lambda table, group: launches.append(group) or slots(table, group)
    for _ in range(3):
        step = random_step(rng, int(rng.integers(1, 30)), config.query_len_max, (7, 6, 4, 3), 3)
        rows = len(step.q)
        for group, table in enumerate(persistent):  # the engine's copy into its tables
            table[:rows, 0] = torch.from_numpy(step.slots[group])
        first = step.metadata("cpu")
        drafts, accepted = step.host_drafts(), step.device_accepted("cpu")
        for group, builder in enumerate(builders):
            m = attrs.evolve(first, block_table_tensor=persistent[group][:rows])
            md = builder.build(
                0, m, num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts
            )
            if (step.q > 0).any():
                assert_seed_exact(md, expected(step, config, group), m, drafts, "cpu")
        assert launches == []
    other = attrs.evolve(first, block_table_tensor=step.metadata("cpu", 1).block_table_tensor)
    kwargs = dict(num_accepted_tokens=accepted, num_decode_draft_tokens_cpu=drafts)
    builders[0].build(0, attrs.evolve(first, block_table_tensor=persistent[0][:rows]), **kwargs)
    md = builders[1].build(0, other, **kwargs)  # not its registered table: its own launch
    assert launches == [1]
    if (step.q > 0).any():
        assert_seed_exact(md, expected(step, config, 1), other, drafts, "cpu")
    with pytest.raises(ValueError, match=r"tables\[0\]: must be a 2-D int32 tensor"):
        share.register_block_tables([torch.zeros(4, dtype=torch.int32)])


def test_metadata_fields_come_in_the_seed_rules_order():
    """The builder fills PlanMetadata by position: counts, then the seed's array fields."""
    from stepplan.executor.vllm import ARRAY_FIELDS, COUNT_FIELDS, PlanMetadata

    fields = PlanMetadata._fields
    assert fields[: len(COUNT_FIELDS) + len(ARRAY_FIELDS)] == COUNT_FIELDS + ARRAY_FIELDS
    assert fields[-7:] == tuple(name for name in fields if name not in fields[:-7])[-7:]


def test_a_build_makes_no_plan_object_until_one_is_asked_for():
    """The build packs the plan's bytes from host data; ``md.plan`` compiles the same plan
    on first access (once), with the placeholders where the device fills in values."""
    config = CONFIGS[0]
    builder = PlanMetadataBuilder(config, "cpu", max_num_tokens=2048)
    compiles = []
    compile_ = builder.share._planner.compile
    builder.share._planner.compile = lambda batch: compiles.append(1) or compile_(batch)
    step = random_step(np.random.default_rng(5), 12, config.query_len_max, (3, 3, 2, 1))
    m, drafts = step.metadata("cpu"), step.host_drafts()
    md = builder.build(0, m, num_decode_draft_tokens_cpu=drafts)
    assert compiles == []
    plan = md.plan
    assert md.plan is plan and compiles == [1]
    assert plan.shape == md.plan_shape
    host = full_plan(step, config)
    assert (plan.graph, plan.layout) == (host.graph, host.layout)
    assert (plan.row_request == host.row_request).all()
    assert not plan.row_slot.any() and not plan.batch.num_computed_tokens.any()


def test_host_views_follow_the_tensors_they_are_given():
    """A further group passing the step's own host tensors gets their kept views (which
    show the tensors' values now); anything else is viewed anew, and no drafts give none."""
    share = StepShare(CONFIGS[0], "cpu", max_num_tokens=64)
    starts = torch.tensor([0, 1, 3], dtype=torch.int32)
    drafts = torch.tensor([0, 1], dtype=torch.int32)
    first = share.host_views(starts, drafts)
    again = share.host_views(starts, drafts)
    assert again[0] is first[0] and again[1] is first[1]
    starts[2] = 4  # the engine writes its tensor in place: the kept view shows it
    assert host_ints(share.host_views(starts, drafts)[0]).tolist() == [0, 1, 4]
    listed = share.host_views(starts, [0, 2])
    assert listed[1].tolist() == [0, 2] and listed[1] is not first[1]
    assert share.host_views(starts, None)[1] is None
    assert host_ints(share.host_views(starts, drafts)[1]).tolist() == [0, 1]
    other = share.host_views(starts.clone(), drafts)
    assert other[0] is not first[0] and host_ints(other[0]).tolist() == [0, 1, 4]


@pytest.mark.skipif(not Planner(CONFIGS[0]).native, reason="needs the compiled packer")
def test_flat_int32_tensors_are_read_in_place_and_the_rest_through_numpy():
    """Only a 1-D, contiguous int32 CPU tensor is handed to the packer as its address; a
    strided, int64 or 2-D one is viewed through numpy, and every way reads the same
    values (a 2-D one is refused later, naming the field)."""
    share = StepShare(CONFIGS[0], "cpu", max_num_tokens=64)
    base = torch.tensor([0, 9, 1, 9, 3, 9], dtype=torch.int32)
    flat = base[::2].contiguous()
    views = {
        "flat": flat,
        "strided": base[::2],
        "int64": flat.to(torch.int64),
        "slice": torch.tensor([0, 1, 3, 7], dtype=torch.int32)[:3],
    }
    assert share.host_views(flat.reshape(1, 3), None)[0].shape == (1, 3)  # 2-D: numpy
    for name, tensor in views.items():
        starts, _ = share.host_views(tensor, None)
        assert (type(starts) is tuple) == (name in ("flat", "slice")), name
        assert host_ints(starts).tolist() == [0, 1, 3], name
        found = share.host_bytes(starts, None, 2, None)  # None: not contiguous, read apart
        assert found is None if name == "strided" else found[2] == 3, name
        assert host_inputs.host_types(starts, None)[0] == tensor.numpy().dtype, name


def split_row_by_row(starts, rows, tokens, prefilling, upper) -> tuple[int, int, int]:
    """vLLM 0.33's split of a step without spec rows, one row at a time: the first row of
    more than one token, or still prefilling unless vLLM updates it as a decode (one token
    with state before it), opens the prefills."""
    for row in range(rows):
        length = int(starts[row + 1] - starts[row])
        updated = length == 1 and upper[row] > 1
        if length > 1 or (prefilling[row] and not updated):
            longest = max(int(starts[r + 1] - starts[r]) for r in range(row, rows))
            return row, int(starts[row]), longest
    return rows, tokens, 0


@settings(max_examples=400, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 4), min_size=1, max_size=40),
    extra=st.integers(0, 3),
    data=st.data(),
    dtype=st.sampled_from([np.int32, np.int64]),
)
def test_vllm_split_follows_its_rule_row_by_row(lengths, extra, data, dtype):
    """The split of steps of one-token, empty and longer rows, any of them still
    prefilling, with or without state before them; arrays longer than ``num_reqs``."""
    rows = len(lengths)
    size = rows + extra
    starts = np.concatenate([[0], np.cumsum(lengths + [0] * extra)]).astype(dtype)
    prefilling = np.array(data.draw(st.lists(st.booleans(), min_size=size, max_size=size)))
    upper = np.array(data.draw(st.lists(st.integers(0, 5), min_size=size, max_size=size)))
    tokens = int(starts[rows]) + data.draw(st.integers(0, 3))
    got = vllm_split(starts, rows, tokens, prefilling, upper)
    assert got == split_row_by_row(starts, rows, tokens, prefilling, upper)
    assert all(type(value) is int for value in got)
