"""The planner's config is the simulation's (``SimConfig.plan``): every field has one setting
as its home, and a value the planner refuses names that setting."""

from __future__ import annotations

import attrs
import pytest

from stepplan.planner import PlannerConfig
from stepplan.sim.settings.config import PLANNER_SETTINGS, ConfigError, SimConfig, with_settings


def test_every_field_of_the_planner_has_one_setting():
    given = {field.name for field in attrs.fields(PlannerConfig) if field.init}
    assert set(PLANNER_SETTINGS) == given
    config = SimConfig()
    for field, (section, key) in PLANNER_SETTINGS.items():
        assert hasattr(getattr(config, section), key), (field, section, key)


def test_the_plan_follows_the_settings():
    config = with_settings(
        SimConfig(),
        {
            "scheduler.num_spec_tokens": 5,
            "scheduler.max_num_seqs": 48,
            "planner.graph_mode": "mixed",
            "planner.graph_sizes": [8, 64],
            "planner.prefill_tile_tokens": 128,
        },
    )
    plan = config.plan
    assert (plan.num_spec_tokens, plan.max_num_seqs, plan.graph_mode) == (5, 48, "mixed")
    assert (plan.graph_sizes, plan.prefill_tile_tokens) == ((8, 64), 128)
    assert config.plan is plan  # made once
    evolved = with_settings(config, {"scheduler.num_spec_tokens": 2})
    assert evolved.plan.num_spec_tokens == 2 and config.plan.num_spec_tokens == 5
    assert "plan" not in config.to_dict()


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("scheduler.num_spec_tokens", 9, "scheduler.num_spec_tokens: must be in 0..7, got 9"),
        ("planner.prefill_tile_tokens", 5, "planner.prefill_tile_tokens: must be a power of two"),
    ],
)
def test_a_refused_value_names_its_setting(setting, value, message):
    config = with_settings(SimConfig(), {setting: value})
    with pytest.raises(ConfigError, match=f"^{message}"):
        assert config.plan is None  # never reached: the property refuses
