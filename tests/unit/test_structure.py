"""The package's shape, read from its own source: no module reaches into another's private attributes (a name
with a leading underscore reached through anything but `self` or `cls`), no module over 600 lines, and no import
cycle between modules. Each rule names what breaks it, and is shown to find a breach in a sample."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2] / "pigeon"
LINES_MAX = 600
# the public methods of namedtuples, which carry a leading underscore so as not to clash with field names
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}
# grpcio offers no public way to keep more than one call of a method asked for at once (pigeon.api.takers says why
# and what it costs when grpcio changes); the simulator's event loop runs asyncio's iteration on virtual time over
# handles of its own, which asyncio's loop reads by their private names (pigeon.testing.simloop): the modules
# allowed to reach into a library's private names
LIBRARY_INTERNALS = {"api/takers.py", "testing/simloop.py"}


def _modules():
    for path in sorted(ROOT.rglob("*.py")):
        if "proto" not in path.relative_to(ROOT).parts:  # (generated)
            yield path


def _name(path: pathlib.Path) -> str:
    return "pigeon." + ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def private_reaches(source: str) -> list[str]:
    """`x._name` where x is not self or cls, as `line: expression`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
            continue
        if node.attr in NAMEDTUPLE_API or (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            continue
        out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def imports(source: str, module: str, known: set[str], is_package: bool = False) -> set[str]:
    """The modules of `known` that `module` imports, at any level of the file (a cycle through a deferred import is
    still a cycle of the design). `from pigeon.x import y` is pigeon.x.y when that is a module, else pigeon.x."""
    package = module if is_package else module.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
            mod = (f"{base}.{node.module}" if node.module else base) if node.level else (node.module or "")
            for a in node.names:
                sub = f"{mod}.{a.name}"
                out.add(sub if sub in known else mod)
    return out & known


def cycles(graph: dict[str, set[str]]) -> list[str]:
    """Every cycle a depth-first walk of `graph` (module → modules it imports) meets, as `a -> b -> a`."""
    found, state = [], {}

    def visit(m, stack):
        state[m] = 1
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == 1:
                found.append(" -> ".join(stack[stack.index(d):] + [d]))
            elif d not in state:
                visit(d, stack)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found


def test_no_module_reaches_into_another_ones_private_attributes():
    found = [f"{p.relative_to(ROOT)}:{hit}" for p in _modules() if str(p.relative_to(ROOT)) not in LIBRARY_INTERNALS
             for hit in private_reaches(p.read_text())]
    assert not found, "private attributes reached from outside:\n" + "\n".join(found)


def test_no_module_is_longer_than_the_limit():
    long = [f"{p.relative_to(ROOT)}: {n} lines" for p in _modules() if (n := len(p.read_text().splitlines())) > LINES_MAX]
    assert not long, f"modules over {LINES_MAX} lines:\n" + "\n".join(long)


def test_no_import_cycle_between_modules():
    mods = {_name(p): p for p in _modules()}
    graph = {m: imports(p.read_text(), m, set(mods), p.name == "__init__.py") - {m} for m, p in mods.items()}
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(found)


def test_each_rule_finds_a_breach_in_a_sample():
    assert private_reaches("def f(engine, self):\n    return engine._change, self._own, t._replace()\n") == \
        ["2: engine._change"]
    known = {"pigeon.node", "pigeon.node.b", "pigeon.core.limits", "pigeon.core.errors"}
    assert imports("from . import b\nfrom ..core import limits\nfrom pigeon.core.errors import Oops\n",
                   "pigeon.node.a", known) == {"pigeon.node.b", "pigeon.core.limits", "pigeon.core.errors"}
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == ["a -> b -> c -> a"]
    assert cycles({"a": {"b"}, "b": set()}) == []
