"""The pure layers do no I/O and read no clock: no asyncio, socket, threading, random, time or os
imports, and no open() calls, anywhere in pigeon/core, pigeon/broker, pigeon/storage, pigeon/cluster."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PURE = ["pigeon/core", "pigeon/broker", "pigeon/storage", "pigeon/cluster"]
FORBIDDEN = {"asyncio", "socket", "threading", "random", "time", "os"}


def pure_files() -> list[Path]:
    return sorted(p for d in PURE for p in (ROOT / d).rglob("*.py"))


def violations(source: str, filename: str) -> list[str]:
    """`file:line: what` for every forbidden import or open() call in `source`."""
    out = []
    tree = ast.parse(source, filename)
    for node in ast.walk(tree):
        bad = []
        if isinstance(node, ast.Import):
            bad = [a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module and node.module.split(".")[0] in FORBIDDEN:
                bad = [node.module]
        elif isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id in ("open", "__import__")) or (
                isinstance(f, ast.Attribute) and f.attr == "import_module"
            ):
                bad = [f"{getattr(f, 'id', getattr(f, 'attr', '?'))}() call"]
        out += [f"{filename}:{node.lineno}: {b}" for b in bad]
    return out


def test_pure_directories_exist_and_hold_code():
    files = pure_files()
    for d in PURE:
        assert (ROOT / d).is_dir(), d
    assert any(p.name == "subscription.py" for p in files)
    assert len(files) >= 10


def test_pure_layers_import_no_io_or_clock():
    found = []
    for p in pure_files():
        found += violations(p.read_text(), str(p.relative_to(ROOT)))
    assert not found, "impure code in a pure layer:\n" + "\n".join(found)


@pytest.mark.parametrize("src", [
    "import os",
    "import os.path",
    "import time as t",
    "from time import monotonic",
    "from asyncio import sleep",
    "import socket, json",
    "def f():\n    import threading",
    "import random",
    "with open('x') as f: pass",
    "x = __import__('os')",
    "import importlib\nimportlib.import_module('os')",
])
def test_checker_catches(src):
    assert violations(src, "x.py"), src


@pytest.mark.parametrize("src", [
    "import json",
    "from pigeon.core import limits",
    "from . import time",  # a sibling module named time is not the stdlib
    "import timeit_like_name_that_is_not_time",
    "f.open()",  # a method named open is fine
])
def test_checker_allows(src):
    assert not violations(src, "x.py"), src


def test_report_names_file_and_line():
    assert violations("import json\n\nfrom time import time\n", "pigeon/core/x.py") == ["pigeon/core/x.py:3: time"]
