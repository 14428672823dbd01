"""`pigeon serve` is parsed without typer (pigeon.cli.serve: a start is what every restart waits for), from the
same table of options the whole command line shows; a single node's start imports neither the command line's
other modules nor the cluster's or security's (typer and pydantic, cryptography, the etcd client)."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest
import typer.main

from pigeon.cli import serve
from pigeon.cli.main import app
from pigeon.ops.config import Config


def test_the_fast_parse_and_the_typer_command_share_one_table_of_settings():
    values = serve.parse(["--port", "9", "--data-dir", "d", "--insecure", "--workers", "2", "--fsync", "batch"])
    assert (values["port"], values["data_dir"], values["insecure"], values["workers"], values["fsync"]) == \
        (9, "d", True, 2, "batch")
    assert values["host"] is None and values["etcd"] is None, "what is not given is left to the settings' defaults"
    command = typer.main.get_command(app).commands["serve"]
    assert sorted(p.opts[0] for p in command.params) == sorted(o.flag for o in serve.OPTIONS)
    settings = {f.name for f in dataclasses.fields(Config)}
    assert {o.name for o in serve.OPTIONS} - {"config"} <= settings, "each option is a setting of ops.config"


@pytest.mark.parametrize("argv", [["--port", "x"], ["--bogus"], ["--port"]])
def test_a_wrong_command_line_is_a_usage_error(argv, capsys):
    with pytest.raises(SystemExit) as e:
        serve.parse(argv)
    assert e.value.code == 2 and "pigeon serve" in capsys.readouterr().err


def test_a_single_nodes_start_imports_no_command_line_framework_nor_the_clusters_modules(tmp_path):
    probe = ("import sys; sys.argv = ['pigeon', 'serve', '--fsync', 'bogus', '--data-dir', sys.argv[1]]\n"
             "from pigeon.cli import entry\n"
             "try:\n    entry.main()\nexcept SystemExit as e:\n    assert e.code == 2, e.code\n"
             "import pigeon.api.server\n"
             "print(sorted(m for m in ('typer', 'pydantic', 'rich', 'cryptography', 'aetcd', 'fastavro', "
             "'pigeon.cli.main', 'pigeon.node.cluster_node') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe, str(tmp_path / "d")], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert "fsync must be always, batch or never" in out.stderr
    assert out.stdout.strip() == "[]", out.stdout
