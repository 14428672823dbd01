"""Writes pigeon.example.toml from the settings table, the `Config` dataclass of pigeon/ops/config.py: every
setting with its default (the value Pigeon runs with) and the comments written beside it there, so the example
cannot say something the code does not. `--check` writes nothing and exits 1 when the file is out of step
(tests/unit/test_example_config.py runs it on every `make test`).

    python scripts/example_config.py            # (re)write pigeon.example.toml
    python scripts/example_config.py --check    # is it in step?
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import pathlib
import re
import sys

from pigeon.core import limits
from pigeon.ops import config

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "pigeon.example.toml"
# set by the `--workers N` supervisor for each worker it starts, never by an operator: left out of the example
WORKERS_ONLY = {"machine", "reuse_port", "own_http_port"}

HEADER = """\
# Pigeon's settings, every one with its default: `pigeon serve --config pigeon.toml`. Uncomment (drop the
# leading "#") what you change. Environment variables PIGEON_<NAME> (PIGEON_DATA_DIR=/var/lib/pigeon) override
# this file, and flags (--data-dir) override both; `pigeon serve --help` says the same in short.
#
# Generated from the settings table in pigeon/ops/config.py by `python scripts/example_config.py`: edit the
# table, not this file (a test fails when they differ).
"""

_FIELD = re.compile(r"^    (\w+): [^=]+?= .+?(?:\s+#\s?(.*))?$")
_CONTINUED = re.compile(r"^    #\s{2,}(.*)$")  # a comment carried on under the field's own (aligned past "# ")
_SECTION = re.compile(r"^    # ?(.*)$")


def table() -> list[tuple[str, list[str], list[str]]]:
    """(field, its comment lines, the section comment lines just before it) in the order of the dataclass."""
    out: list[tuple[str, list[str], list[str]]] = []
    section: list[str] = []
    for line in inspect.getsource(config.Config).splitlines()[1:]:
        if line.startswith("    def ") or line.startswith("    @"):
            break  # the fields end where the methods begin
        if m := _CONTINUED.match(line):
            assert out, f"a continued comment before any field: {line!r}"
            out[-1][1].append(m.group(1).strip())
        elif m := _SECTION.match(line):
            section.append(m.group(1).strip())
        elif m := _FIELD.match(line):
            out.append((m.group(1), [m.group(2).strip()] if m.group(2) else [], section))
            section = []
    fields = [f.name for f in dataclasses.fields(config.Config)]
    assert [name for name, _, _ in out] == fields, "the table's fields could not all be read from the source"
    return out


def toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    raise TypeError(f"a setting of type {type(value).__name__} has no TOML form here: {value!r}")


def limit_comments() -> dict[str, str]:
    """The comment beside each limit of pigeon/core/limits.py (a setting whose default is one says what it is)."""
    out = {}
    for line in inspect.getsource(limits).splitlines():
        if m := re.match(r"^(\w+) = [^#]+#\s?(.*)$", line):
            out[m.group(1)] = m.group(2).strip()
    return out


def described(name: str, comment: list[str], options: dict[str, str], from_limits: dict[str, str]) -> list[str]:
    """What a setting is: its comment in the table, else its flag's help (`pigeon serve --help`), else the comment
    of the limit its default is."""
    if comment:
        return comment
    if name in options:
        return [options[name]]
    m = re.search(r"= limits\.(\w+)", _source_line(name))
    return [from_limits[m.group(1)]] if m and m.group(1) in from_limits else []


def _source_line(name: str) -> str:
    return next(line for line in inspect.getsource(config.Config).splitlines() if line.startswith(f"    {name}:"))


def render() -> str:
    from pigeon.cli.serve import OPTIONS

    defaults = config.Config()
    options = {o.name: o.help for o in OPTIONS}
    from_limits = limit_comments()
    parts = [HEADER]
    for name, comment, section in table():
        if name in WORKERS_ONLY:
            continue
        comment = described(name, comment, options, from_limits)
        lines = [""]
        if section:
            lines += ["# " + "=" * 110, *("# " + s for s in section), "# " + "=" * 110, ""]
        lines += ["# " + c for c in comment]
        lines.append(f"#{name} = {toml_value(getattr(defaults, name))}")
        parts.append("\n".join(lines) + "\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 when the file is out of step")
    parser.add_argument("--out", type=pathlib.Path, default=EXAMPLE, help="where (default: pigeon.example.toml)")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text() if args.out.exists() else None
        if current != text:
            print(f"{args.out} is out of step with pigeon/ops/config.py: run `python scripts/example_config.py`",
                  file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
