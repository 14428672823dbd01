"""Pigeon's version: the one place it is written. pyproject.toml reads it (setuptools' `attr:`, which parses this
file without importing the package), `pigeon.__version__`, `pigeon --version` and `pigeon_build_info` use it.
A release changes it here, dates its CHANGELOG.md section and is tagged `v<version>` (README: Releases)."""

from __future__ import annotations

import os
import subprocess
from functools import lru_cache

__version__ = "0.1.0"


@lru_cache(maxsize=1)
def commit() -> str:
    """The short commit of the checkout the package runs from, else "unknown" (an installed wheel carries no
    history). Asked once per process: a scrape of /metrics must not start a git process."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    if not os.path.exists(os.path.join(root, ".git")):  # a directory, or a file in a worktree
        return "unknown"
    try:
        out = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             timeout=5)
    except (OSError, subprocess.SubprocessError):  # no git on this machine, or it hung
        return "unknown"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown"
