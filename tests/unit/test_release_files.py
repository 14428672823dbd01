"""What a release is made of: the licence in the files and in the package's metadata, the version written once
(pigeon/version.py, which pyproject.toml reads), a CHANGELOG.md section for it, and the commit a build reports."""

from __future__ import annotations

import importlib.util
import pathlib
import re
import shutil
import subprocess
import tomllib

import pigeon
from pigeon import version

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_apache_licence_in_the_files_and_the_metadata():
    licence = (ROOT / "LICENSE").read_text()
    assert "Apache License" in licence and "Version 2.0, January 2004" in licence
    assert "END OF TERMS AND CONDITIONS" in licence, "the whole text, not a pointer to it"
    assert "Apache License, Version 2.0" in (ROOT / "NOTICE").read_text()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"
    assert set(project["license-files"]) == {"LICENSE", "NOTICE"}
    # PEP 639: a licence expression and a licence classifier together are refused by the build backend
    assert not [c for c in project["classifiers"] if c.startswith("License ::")]


def test_the_version_is_written_once():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "pigeon.version.__version__"}
    assert pigeon.__version__ == version.__version__
    assert re.fullmatch(r"0\.\d+\.\d+", version.__version__), "the v0.x scheme (README: releases)"


def test_the_changelog_has_a_section_for_the_version():
    headings = re.findall(r"^## (.+)$", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == "Unreleased", "what is not released yet goes first"
    assert any(re.fullmatch(rf"{re.escape(version.__version__)} - \d{{4}}-\d\d-\d\d", h) for h in headings), \
        f"CHANGELOG.md has no dated section for {version.__version__}: {headings}"


def test_commit_from_a_checkout_and_unknown_elsewhere(tmp_path):
    if shutil.which("git") and (ROOT / ".git").exists():
        head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True).stdout.strip()
        assert version.commit() == head
    copy = tmp_path / "site" / "pigeon" / "version.py"  # as an installed wheel lays it out: no .git above it
    copy.parent.mkdir(parents=True)
    shutil.copy(version.__file__, copy)
    spec = importlib.util.spec_from_file_location("installed_version", copy)
    installed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(installed)
    assert installed.commit() == "unknown"
