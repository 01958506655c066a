"""A stalled run's error names the request first in line and why an empty engine does not
admit it (``sim/stall.py``). Settings that pass ``check_config`` never stall, so these
schedulers are built around it: a pool smaller than a prompt, a budget below a padded row.
"""

from __future__ import annotations

import math

import numpy as np
from test_memory import make_layout, make_table

from stepplan.sim.memory import BlockPool
from stepplan.sim.scheduler import Scheduler
from stepplan.sim.settings.config import SchedulerConfig
from stepplan.sim.settings.config_values import ConfigError
from stepplan.sim.stall import StallError, stall_error


def test_a_prompt_larger_than_the_cache_is_named_with_its_blocks():
    table = make_table([0.0, 0.5], [4, 9], [3, 2])
    config = SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=100, num_spec_tokens=0)
    scheduler = Scheduler(table, config, BlockPool(make_layout(6, block_size=1, slots=2), table))
    clock = 0.0
    while (found := scheduler.schedule(clock)) is not None or clock < 0.5:
        if found is not None:
            scheduler.commit(found, np.zeros(found.batch.num_rows, np.int32))
        clock += 0.25
    assert scheduler.running.size == 0 and not scheduler.done
    error = stall_error(scheduler, clock)
    assert isinstance(error, ConfigError)  # the command line prints it as one line, exit 2
    assert str(error) == (
        "run stalled at 0.75 s: request 1 (prompt 9 + output 2 tokens) cannot be admitted "
        "while nothing runs: its prompt needs 9 KV blocks and the cache has 6 free of 6 "
        "(memory.kv_cache_gib)"
    )


def test_a_budget_below_a_padded_row_is_named():
    table = make_table([0.0], [1], [4])
    config = SchedulerConfig(max_num_seqs=1, max_num_batched_tokens=2, num_spec_tokens=3)
    scheduler = Scheduler(table, config)
    error = stall_error(scheduler, math.inf)
    assert isinstance(error, StallError) and "\n" not in str(error)
    assert str(error) == (
        "run stalled: request 0 (prompt 1 + output 4 tokens) cannot be admitted while "
        "nothing runs: scheduler.max_num_batched_tokens = 2 is less than the 4 tokens a "
        "padded row takes (scheduler.num_spec_tokens + 1)"
    )
