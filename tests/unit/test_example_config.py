"""pigeon.example.toml is in step with the settings table (pigeon/ops/config.py's Config): regenerated, it is
the same file; uncommented, it loads to exactly the defaults; it leaves out only what the --workers supervisor
sets for its workers."""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import re

import pytest

from pigeon.ops import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("example_config", ROOT / "scripts" / "example_config.py")
example_config = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example_config)

SETTING = re.compile(r"^#(\w+) = ", re.M)


def test_the_example_is_in_step_with_the_table():
    assert example_config.main(["--check"]) == 0, "run `python scripts/example_config.py` and commit the file"


def test_a_stale_example_is_found(tmp_path, capsys):
    stale = tmp_path / "pigeon.example.toml"
    stale.write_text(example_config.render().replace("#port = 8085", "#port = 9000"))
    assert example_config.main(["--check", "--out", str(stale)]) == 1
    assert "out of step" in capsys.readouterr().err
    assert example_config.main(["--check", "--out", str(tmp_path / "missing.toml")]) == 1


def test_uncommented_it_loads_to_the_defaults(tmp_path):
    text = (ROOT / "pigeon.example.toml").read_text()
    shown = SETTING.findall(text)
    fields = [f.name for f in dataclasses.fields(config.Config)]
    assert sorted(shown) == sorted(set(fields) - example_config.WORKERS_ONLY)
    live = tmp_path / "pigeon.toml"
    live.write_text(SETTING.sub(r"\1 = ", text))
    assert config.load(str(live), env={}) == config.Config()


def test_every_setting_says_what_it_is():
    text = (ROOT / "pigeon.example.toml").read_text()
    for m in SETTING.finditer(text):
        above = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        assert above.startswith("# ") and not above.startswith("# ==="), f"{m.group(1)} has no description"


def test_a_setting_that_toml_cannot_say_is_refused():
    with pytest.raises(TypeError, match="no TOML form"):
        example_config.toml_value(None)
