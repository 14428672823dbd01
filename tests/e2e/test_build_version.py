"""Which build runs, as a user asks it: `pigeon --version`, and `pigeon_build_info` on a node's /metrics."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pigeon.version import __version__, commit
from tests.e2e.test_metrics import scrape

pytestmark = pytest.mark.e2e


def test_version_on_the_command_line():
    out = subprocess.run([sys.executable, "-m", "pigeon", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["pigeon", __version__]
    assert (commit() in out.stdout) == (commit() != "unknown")


def test_build_info_on_metrics(server_factory):
    m = scrape(server_factory(http=True).http)
    assert m[("pigeon_build_info", (("commit", commit()), ("version", __version__)))] == 1
    assert len([k for k in m if k[0] == "pigeon_build_info"]) == 1
