"""docs/alerts.yml: promtool checks the rules and runs their unit tests (docs/alerts.test.yml); every metric a rule
reads is one Pigeon defines; and a real 3-node cluster that loses a node with SIGKILL shows it in the survivors'
/metrics — the series of the node-down and under-replicated rules have values their expressions fire on (the
expressions, read from the rules file, evaluated by promtool over the scraped values)."""

from __future__ import annotations

import pathlib
import re
import shutil
import subprocess
import time

import pytest
import yaml

from pigeon.testing.cluster import start_nodes
from tests.e2e.test_metrics import scrape

pytestmark = pytest.mark.e2e

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "docs" / "alerts.yml"


def promtool(*args: str, cwd: pathlib.Path = ROOT) -> subprocess.CompletedProcess:
    found = shutil.which("promtool")
    assert found, "promtool is missing: `make test` installs it (Debian's prometheus package)"
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=60, cwd=cwd)


def rules() -> dict[str, dict]:
    return {r.get("alert") or r["record"]: r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}


def test_promtool_checks_the_rules_and_passes_their_unit_tests():
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = promtool("test", "rules", "alerts.test.yml", cwd=RULES.parent)
    assert tested.returncode == 0, tested.stdout + tested.stderr
    wanted = {"PigeonNodeDown", "PigeonLedgersUnderReplicated", "PigeonBacklogOld", "PigeonErrorRatioHigh",
              "PigeonDiskReserveReached", "PigeonEtcdUnreachable", "PigeonProberFailing", "PigeonSLOBurnRateFast"}
    assert wanted <= set(rules())
    untested = {name for name in rules() if name.startswith("Pigeon")} - set(
        re.findall(r"alertname: (\w+)", (RULES.parent / "alerts.test.yml").read_text()))
    assert not untested, f"rules without a unit test: {sorted(untested)}"


def test_every_metric_the_rules_read_is_defined_in_pigeon():
    source = "\n".join(p.read_text() for p in (ROOT / "pigeon").rglob("*.py"))
    read = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in re.findall(r"\bpigeon_\w+", RULES.read_text())}
    missing = {n for n in read if f'"{n}"' not in source}
    assert not missing, f"the rules read metrics nothing exports: {sorted(missing)}"


def test_a_killed_node_shows_in_the_survivors_node_down_and_under_replicated_series(etcd, tmp_path):
    nodes = start_nodes(str(tmp_path), etcd.endpoint, http=True)
    try:
        def cluster_series(node: str) -> dict:
            return {k: v for k, v in scrape(nodes[node].http).items() if k[0] in (
                "pigeon_cluster_nodes", "pigeon_cluster_ledgers_below_replicas")}

        def wait_for(ok, what: str, on=("n1", "n2"), timeout: float = 20.0) -> dict[str, dict]:
            deadline = time.monotonic() + timeout
            while True:
                seen = {n: cluster_series(n) for n in on}
                if all(ok(m) for m in seen.values()):
                    return seen
                assert time.monotonic() < deadline, f"waited {timeout:g} s for {what}; the survivors say {seen}"
                time.sleep(0.3)

        def down(m: dict) -> float:
            return m.get(("pigeon_cluster_nodes", (("state", "down"),)), -1)

        def short(m: dict) -> float:
            return m.get(("pigeon_cluster_ledgers_below_replicas", ()), -1)

        def up(m: dict) -> float:
            return m.get(("pigeon_cluster_nodes", (("state", "up"),)), -1)

        # (the first scrape starts a node's first read of etcd)
        wait_for(lambda m: up(m) == 3 and down(m) == 0, "the cluster's view of three nodes up")
        nodes["n3"].kill()
        seen = wait_for(lambda m: down(m) == 1 and short(m) > 0, "n3 down and its ledgers short of a copy")
    finally:
        for n in nodes.values():
            n.kill()

    # the rules' own expressions over what the survivors said: both evaluate to a sample, i.e. they fire
    r = rules()
    for alert, want in (("PigeonNodeDown", 1), ("PigeonLedgersUnderReplicated", max(short(m) for m in seen.values()))):
        got = evaluate(r[alert]["expr"], seen, tmp_path)
        assert got == [want], f"{alert}: {r[alert]['expr']} gave {got} over {seen}"


def evaluate(expr: str, samples: dict[str, dict[tuple, float]], tmp: pathlib.Path) -> list[float]:
    """The values `expr` has over `samples` (node → its scraped samples, held for a quarter of an hour), by promtool:
    a test of it that expects nothing fails and prints what it got."""
    series = [{"series": "%s{%s}" % (name, ",".join([f'instance="{node}"', 'job="pigeon"'] +
                                                    [f'{k}="{v}"' for k, v in labels])), "values": f"{value:g}x15"}
              for node, m in samples.items() for (name, labels), value in m.items()]
    test = {"evaluation_interval": "1m", "tests": [{"interval": "1m", "input_series": series, "promql_expr_test": [
        {"expr": expr, "eval_time": "10m", "exp_samples": []}]}]}
    (tmp / "eval.test.yml").write_text(yaml.safe_dump(test))
    out = promtool("test", "rules", "eval.test.yml", cwd=tmp)
    if out.returncode == 0:
        return []
    got = re.search(r"got: (.*)", out.stdout + out.stderr)
    assert got, out.stdout + out.stderr
    return [float(v) for v in re.findall(r"\} (\S+)", got.group(1))]
