"""deploy/systemd/pigeon.service: systemd's own checker accepts it, it runs Pigeon as a user of its own on the
data directory systemd makes, restarts it on failure, and its command — with the shipped pigeon.example.toml as
its settings — serves and stops cleanly (exit 0, well inside TimeoutStopSec) on the signal the unit stops with."""

from __future__ import annotations

import configparser
import os
import pathlib
import shlex
import shutil
import signal
import subprocess
import sys
import time

import pytest

from pigeon.bench.procs import await_listening, free_port
from pigeon.core import limits

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
UNIT = ROOT / "deploy" / "systemd" / "pigeon.service"
BINARY = "/opt/pigeon/bin/pigeon"  # where the unit's comment installs Pigeon
PIGEON = str(pathlib.Path(sys.executable).parent / "pigeon")  # the command installed beside the tests' Python


def service() -> configparser.SectionProxy:
    unit = configparser.ConfigParser(interpolation=None, strict=True)
    unit.optionxform = str  # (systemd's keys are case-sensitive)
    unit.read_string(UNIT.read_text())
    return unit["Service"]


def test_the_unit_runs_pigeon_as_its_own_user_on_its_state_directory():
    s = service()
    assert s["User"] not in ("root", "0") and s["Group"] not in ("root", "0")
    argv = shlex.split(s["ExecStart"])
    assert argv[:2] == [BINARY, "serve"]
    assert argv[argv.index("--data-dir") + 1] == f"/var/lib/{s['StateDirectory']}"
    assert s["Restart"] == "on-failure"
    assert s["KillSignal"] == "SIGTERM"
    # a --workers supervisor may take worker_stop_s to stop its workers: systemd must not SIGKILL it before
    assert float(s["TimeoutStopSec"]) > limits.worker_stop_s


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="systemd-analyze is not installed")
def test_systemd_analyze_verify_accepts_the_unit(tmp_path):
    if not os.path.exists(PIGEON):
        pytest.skip(f"no installed pigeon command at {PIGEON}")
    here = tmp_path / "pigeon.service"  # (verify checks that the command exists: this install's)
    here.write_text(UNIT.read_text().replace(BINARY, PIGEON))
    out = subprocess.run(["systemd-analyze", "verify", str(here)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and not out.stderr.strip(), out.stderr


def test_the_units_command_serves_with_the_example_settings_and_stops_cleanly(tmp_path):
    s = service()
    settings = tmp_path / "pigeon.toml"
    shutil.copy(ROOT / "pigeon.example.toml", settings)  # as the unit's comment installs it
    argv = [PIGEON if a == BINARY else str(settings) if a == "/etc/pigeon/pigeon.toml" else
            str(tmp_path / "data") if a == "/var/lib/pigeon" else a for a in shlex.split(s["ExecStart"])]
    port = free_port()
    log_path = tmp_path / "pigeon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([*argv, "--port", str(port), "--http-port", "0"], stdout=log, stderr=subprocess.STDOUT)
    try:
        await_listening(proc, port, 30, "pigeon (the unit's command)", str(log_path), log_path.read_text)
        proc.send_signal(getattr(signal, s["KillSignal"]))
        t0 = time.monotonic()
        assert proc.wait(float(s["TimeoutStopSec"])) == 0, log_path.read_text()
        assert time.monotonic() - t0 < limits.shutdown_grace_s + 3
        assert "stopped" in log_path.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
