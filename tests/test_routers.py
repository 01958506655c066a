"""The routers (``sim/deployment/routers.py``): each one's choice against a plain
reference over random replica states, the prefix-aware rule inside real runs, and bad
``--replicas``/``--router`` values refused in one line."""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepplan.sim import cli
from stepplan.sim.deployment import ROUTER_NAMES, TABLE, RouterSetup, make_router
from stepplan.sim.deployment import loop as deployment_loop
from stepplan.sim.settings.config import SimConfig, load_config, with_settings
from stepplan.sim.traces import RequestTable


@attrs.define
class FakeReplica:
    """A replica's state as a router reads it."""

    outstanding: int
    kv_usage: float
    cached: tuple[int, ...]  # hashes its cache holds
    wait_s: float

    def cached_prefix(self, hashes) -> int:
        run = 0
        for entry in hashes:
            if entry not in self.cached:
                break
            run += 1
        return run

    def predicted_wait_s(self, now_s: float) -> float:
        return self.wait_s


replica_states = st.lists(
    st.builds(
        FakeReplica,
        st.integers(0, 4),
        st.sampled_from([0.0, 0.25, 0.5]),
        st.sets(st.integers(0, 5)).map(lambda s: tuple(sorted(s))),
        st.sampled_from([0.0, 0.1, 0.2]),
    ),
    min_size=1,
    max_size=6,
)


def first_best(keys: list) -> int:
    """The reference: the lowest index among the smallest keys."""
    return min(range(len(keys)), key=lambda i: (keys[i], i))


@settings(max_examples=200, deadline=None)
@given(replicas=replica_states, hashes=st.lists(st.integers(0, 5), max_size=5))
def test_each_router_against_its_reference(replicas, hashes):
    count = len(replicas)
    setup = RouterSetup(count, 0, np.array([0, len(hashes)]), np.array(hashes, np.int64))
    choice = {name: make_router(name, setup).choose(0, replicas, 0.0) for name in ROUTER_NAMES}
    assert choice["round-robin"] == 0
    assert 0 <= choice["random"] < count
    assert choice["least-outstanding"] == first_best([r.outstanding for r in replicas])
    assert choice["least-kv"] == first_best([(r.kv_usage, r.outstanding) for r in replicas])
    waits = [(r.wait_s, r.outstanding) for r in replicas]
    assert choice["least-wait"] == first_best(waits)
    prefix = [r.cached_prefix(hashes) for r in replicas]
    assert choice["prefix-aware"] == first_best(
        [(-p, r.outstanding) for p, r in zip(prefix, replicas, strict=True)]
    )


@settings(max_examples=200, deadline=None)
@given(replicas=replica_states, hashes=st.lists(st.integers(0, 5), min_size=1, max_size=5))
def test_prefix_aware_never_leaves_a_longer_prefix_at_equal_load(replicas, hashes):
    setup = RouterSetup(len(replicas), 0, np.array([0, len(hashes)]), np.array(hashes))
    router = make_router("prefix-aware", setup)
    chosen = router.choose(0, replicas, 0.0)
    mine = replicas[chosen]
    for other in replicas:
        if other.outstanding == mine.outstanding:
            assert other.cached_prefix(hashes) <= mine.cached_prefix(hashes)
    least = first_best([r.outstanding for r in replicas])
    assert router.moved == int(chosen != least)


def test_round_robin_turns_and_random_repeats_with_its_seed():
    replicas = [FakeReplica(0, 0.0, (), 0.0)] * 3
    turns = make_router("round-robin", RouterSetup(3))
    assert [turns.choose(i, replicas, 0.0) for i in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    draws = [make_router("random", RouterSetup(3, seed=4)) for _ in range(2)]
    picks = [[d.choose(i, replicas, 0.0) for i in range(50)] for d in draws]
    assert picks[0] == picks[1] and set(picks[0]) == {0, 1, 2}
    other = make_router("random", RouterSetup(3, seed=5))
    assert [other.choose(i, replicas, 0.0) for i in range(50)] != picks[0]


def test_every_router_is_one_registry_entry_with_a_description():
    assert len(set(ROUTER_NAMES)) == len(TABLE) == 6
    for entry in TABLE:
        assert entry.description
        assert with_settings(SimConfig(), {"deployment.router": entry.name})


def shared_prefix_table() -> RequestTable:
    """Requests of four families whose prompts share their leading 512-token blocks
    (round-robin over three replicas spreads each family over all of them)."""
    n = 48
    families = np.arange(n) % 4
    offsets = np.arange(n + 1, dtype=np.int64) * 3
    blocks = np.concatenate([[f * 10, f * 10 + 1, f * 10 + 2] for f in families])
    return RequestTable(
        np.arange(n) * 0.05,
        np.full(n, 1600),
        np.full(n, 30),
        prefix_offsets=offsets,
        prefix_blocks=blocks.astype(np.int64),
        source="families",
        format="synthetic",
    )


def test_prefix_aware_in_a_run_follows_the_cache(monkeypatch):
    """Inside a run, at every arrival: the replica chosen holds a cached prefix at least
    as long as any replica of equal load; the families settle on replicas, and the
    prefix cache's hit rate beats round-robin's."""
    seen: list[tuple[int, list[int], list[int]]] = []

    def checking(name, setup):
        router = make_router(name, setup)
        choose = router.choose

        def checked(request, replicas, now_s):
            start, stop = setup.prefix_offsets[request : request + 2]
            hashes = setup.prefix_blocks[start:stop].tolist()
            loads = [r.outstanding for r in replicas]
            runs = [r.cached_prefix(hashes) for r in replicas]
            chosen = choose(request, replicas, now_s)
            seen.append((chosen, loads, runs))
            return chosen

        router.choose = checked
        return router

    monkeypatch.setattr(deployment_loop, "make_router", checking)
    table = shared_prefix_table()
    rates = {}
    for name in ("prefix-aware", "round-robin"):
        config = with_settings(SimConfig(), {"deployment.replicas": 3, "deployment.router": name})
        end = deployment_loop.run_deployment(table, config, _Discard())
        rates[name] = end.summary["memory"]["prefix_cache_hit_rate"]
        if name == "prefix-aware":
            for chosen, loads, runs in seen:
                for load, run in zip(loads, runs, strict=True):
                    assert not (load == loads[chosen] and run > runs[chosen])
            # the default hybrid model caches in 48-token aligned entries: whole hashed
            # blocks are seen cached through them
            assert any(max(runs) >= 3 for _, _, runs in seen)
            assert end.summary["deployment"]["moved_by_prefix"] > 0
    assert rates["prefix-aware"] > rates["round-robin"]


class _Discard:
    def start(self, rows):
        pass

    def add_steps(self, steps):
        pass

    def add_requests(self, rows):
        pass


@pytest.mark.parametrize(
    ("flags", "fragment"),
    [
        (["--replicas", "0"], "deployment.replicas: must be 1 to 1024, got 0"),
        (["--replicas", "5000"], "deployment.replicas: must be 1 to 1024, got 5000"),
        (["--replicas", "two"], "--replicas: invalid int value: 'two'"),
        (["--router", "fastest"], "--router: invalid choice: 'fastest'"),
        (["--set", "deployment.router=fastest"], "deployment.router: must be one of"),
        (["--replicas", "2", "--live"], "live.enabled: live mode runs one engine"),
    ],
)
def test_bad_replicas_or_router_is_one_line(tmp_path, capsys, flags, fragment):
    argv = ["simulate", "synthetic:n=5,rate=1", *flags, "--out", str(tmp_path / "o"), "--quiet"]
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("stepplan: error: "), captured.err
    assert fragment in lines[0], lines[0]
    assert not (tmp_path / "o").exists()


def test_deployment_in_toml(tmp_path, capsys):
    path = tmp_path / "deploy.toml"
    path.write_text('[deployment]\nreplicas = 4\nrouter = "prefix-aware"\n')
    config = load_config(path)
    assert (config.deployment.replicas, config.deployment.router) == (4, "prefix-aware")
    path.write_text("[deployment]\nreplicas = 0\n")
    argv = ["simulate", "synthetic:n=5,rate=1", "--config", str(path), "--quiet"]
    assert cli.main([*argv, "--out", str(tmp_path / "o")]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith(f"stepplan: error: {path}: deployment.replicas: must be 1 to 1024")
