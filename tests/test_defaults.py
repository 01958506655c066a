"""One truth per default: for every setting, ``--help``, ``stepplan config`` and the run's
notes show the same value, from ``sim/settings/config_defaults.py``."""

from __future__ import annotations

import argparse
import re

import pytest
import tomllib

from stepplan.sim import cli
from stepplan.sim.cli.helptext import _SETTINGS
from stepplan.sim.settings.config import SimConfig, with_settings
from stepplan.sim.settings.config_defaults import UNSET, setting_keys, setting_text, setting_value


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def help_texts(command: str) -> dict[str, str]:
    """Each setting's ``--help`` text of ``command``, by the setting it overrides."""
    sub = argparse.Namespace(choices=subcommands())
    formatter = sub.choices[command]._get_formatter()
    return {
        _SETTINGS[action.dest]: formatter._get_help_string(action)
        for action in sub.choices[command]._actions
        if action.dest in _SETTINGS
    }


def config_lines(capsys, *flags: str) -> dict[str, str]:
    """``stepplan config``'s line of each setting, by its dotted key: ``= TOML`` when
    set, ``not set: TEXT`` when not."""
    assert cli.main(["config", *flags]) == 0
    section, lines = "", {}
    for line in capsys.readouterr().out.splitlines():
        if match := re.fullmatch(r"\[(\w+)\]", line):
            section = match[1] + "."
        elif match := re.fullmatch(r"# (\w+): (not set: .*)", line):
            lines[section + match[1]] = match[2]
        elif match := re.fullmatch(r"(\w+) = (.*)", line):
            lines[section + match[1]] = "= " + match[2]
    return lines


def test_help_config_and_the_settings_agree_on_every_default(capsys):
    defaults = SimConfig()
    helps = help_texts("simulate")
    lines = config_lines(capsys)
    assert set(lines) == set(setting_keys())  # config prints every setting
    assert len(helps) >= 25
    for key in setting_keys():
        text = setting_text(defaults, key)
        value = setting_value(defaults, key)
        if value is None:
            assert lines[key] == f"not set: {text}", key
        else:
            shown = tomllib.loads(f"v {lines[key]}")["v"]
            assert shown == (list(value) if isinstance(value, tuple) else value), key
        if key in helps:
            assert helps[key].endswith(f"(default: {text})"), (key, helps[key])
            assert helps[key].lower().count("default") == 1, (key, helps[key])


def test_every_command_with_setting_flags_shows_the_same_defaults():
    defaults = SimConfig()
    commands = [name for name, parser in subcommands().items()
                if any(action.dest in _SETTINGS for action in parser._actions)]  # fmt: skip
    assert {"simulate", "compare", "profile", "fidelity", "capacity", "buckets"} <= set(commands)
    for command in commands:
        for key, text in help_texts(command).items():
            # buckets reads a run's folder: what it leaves unset is the run's setting.
            expected = "(default: the run's" if command == "buckets" else (
                f"(default: {setting_text(defaults, key)})")  # fmt: skip
            assert expected in text and text.lower().count("default") == 1, (command, key, text)


def test_every_unset_setting_says_what_it_stands_for():
    unset = [k for k in setting_keys() if setting_value(SimConfig(), k) in (None, "")]
    # Where None means something other than "none", the text says what.
    assert {"model.max_model_len", "scheduler.slot_capacity", "gpu.peak_flops"} <= set(UNSET)
    for key in unset:
        assert setting_text(SimConfig(), key), key
    assert setting_text(SimConfig(), "model.max_model_len") == "131072, the hybrid-8b preset's"


@pytest.mark.parametrize("flags", [(), ("--set", "model.name=tiny")])
def test_the_max_model_len_note_states_the_default_that_help_and_config_state(
    tmp_path, capsys, flags
):
    config = with_settings(SimConfig(), {"model.name": "tiny"} if flags else {})
    limit = config.model.resolved().max_model_len
    lines = config_lines(capsys, *flags)
    assert lines["model.max_model_len"] == f"not set: {setting_text(config, 'model.max_model_len')}"
    assert lines["model.max_model_len"].startswith(f"not set: {limit}, the ")
    if not flags:
        assert help_texts("simulate")["model.max_model_len"].endswith(
            f"(default: {limit}, the hybrid-8b preset's)"
        )
    trace = tmp_path / "t.csv"
    trace.write_text(f"input_tokens,output_tokens\n5,5\n{limit},1\n")
    argv = ["simulate", str(trace), "--quiet", "--out", str(tmp_path / "out"), *flags]
    assert cli.main(argv) == 0
    notes = capsys.readouterr().err
    assert f"rejected 1 request(s) longer than model.max_model_len = {limit} tokens" in notes
