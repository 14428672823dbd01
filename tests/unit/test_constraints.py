"""constraints.txt against pyproject.toml: every dependency pyproject names (the runtime's and every extra's) is
pinned there exactly once, with `==`, to a version its range allows — so `make`, which installs through the
constraints, runs the tests on versions a user's install may also get. The slow check, a wheel installed into
fresh virtualenvs, is `make package-check` (tests/e2e/test_package.py)."""

from __future__ import annotations

import os
import tomllib

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _project() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _pins() -> dict[str, Requirement]:
    pins: dict[str, Requirement] = {}
    with open(os.path.join(ROOT, "constraints.txt")) as f:
        for line in f:
            line = line.split("#", 1)[0].strip()
            if line:
                req = Requirement(line)
                name = canonicalize_name(req.name)
                assert name not in pins, f"{req.name} pinned twice in constraints.txt"
                pins[name] = req
    return pins


def _wanted() -> list[Requirement]:
    project = _project()["project"]
    named = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        named += extra
    return [Requirement(r) for r in named]


def test_every_pin_is_exact():
    for name, req in _pins().items():
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"constraints.txt: {req} is not an exact pin"


def test_every_dependency_is_pinned_within_its_range():
    pins = _pins()
    for req in _wanted():
        pin = pins.get(canonicalize_name(req.name))
        assert pin is not None, f"{req.name} (pyproject.toml) has no pin in constraints.txt"
        version = next(iter(pin.specifier)).version
        assert req.specifier.contains(version, prereleases=True), f"constraints.txt: {pin} is outside {req}"


def test_nothing_pinned_that_pyproject_does_not_name():
    named = {canonicalize_name(r.name) for r in _wanted()}
    assert set(_pins()) - named == set(), "pinned in constraints.txt but named nowhere in pyproject.toml"


def test_runtime_dependencies_are_ranges():
    """A package installed beside others names ranges: an exact pin belongs in constraints.txt."""
    for r in _project()["project"]["dependencies"]:
        ops = {s.operator for s in Requirement(r).specifier}
        assert "==" not in ops and ">=" in ops and "<" in ops, f"pyproject.toml: {r} is not a range"


def test_the_build_pins_the_cython_make_installs():
    build = [Requirement(r) for r in _project()["build-system"]["requires"]]
    cython = next(r for r in build if canonicalize_name(r.name) == "cython")
    assert str(cython.specifier) == str(_pins()["cython"].specifier)
