"""`pigeon bench --plan smoke` against a real server: the benchmark runs end to end and its JSON has the expected
shape. No figure is asserted beyond "something was measured": the benchmark reports, tests stay deterministic."""

import importlib.util
import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.e2e


def test_smoke_plan_publishes_and_consumes_alone_and_at_once(tmp_path):
    out = tmp_path / "bench.json"
    results = tmp_path / "results"
    run = subprocess.run([sys.executable, "-m", "pigeon", "bench", "--plan", "smoke", "--json", str(out),
                          "--out", str(results)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    doc = json.loads(out.read_text())
    # the result set is named by the run's UTC start, so two runs of one day keep both
    stamp = doc["when"][:10] + "T" + doc["when"][11:13] + doc["when"][14:16]
    assert doc["when"].endswith("+00:00")
    written = sorted(p.name for p in results.iterdir())
    charted = importlib.util.find_spec("matplotlib") is not None  # the chart needs the bench extra
    assert [n.rsplit(".", 1)[1] for n in written] == ["json", "md"] + (["png"] if charted else [])
    assert all(n.startswith(stamp + "-") for n in written), (stamp, written)
    assert doc["plan"] == "smoke"
    assert set(doc["machine"]) >= {"cores", "memory_bytes", "cpu"}
    pigeon = doc["targets"]["pigeon"]
    assert pigeon["errors"] == {}
    assert "fsync=always" in pigeon["server"]
    published = pigeon["results"]["publish_b100"]
    consumed = pigeon["results"]["consume"]
    assert published["count"] > 0 and published["msgs_per_s"] > 0 and published["batch"] == 100
    assert 0 < consumed["count"] <= consumed["backlog"] <= published["published_total"]
    assert consumed["msgs_per_s"] > 0
    both = pigeon["results"]["mixed"]  # publish and consume at once, on a topic of its own
    assert both["published"] > 0 and 0 < both["consumed"] <= both["published"]
    assert both["backlog_left"] == both["published"] - both["consumed"]
    assert both["publish_msgs_per_s"] > 0 and both["consume_msgs_per_s"] > 0
    assert {"busy_pct", "bench_pct", "other_pct"} <= set(published["cpu"])


def test_the_authenticated_tls_rows_measure_a_secured_server(tmp_path):
    """`pigeon-tls` (TLS + tokens, every call authorized) and `pigeon-auth` (tokens, no TLS) beside plain Pigeon."""
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "pigeon", "bench", "--plan", "smoke", "--workloads", "publish",
                          "--peers", "pigeon-tls,pigeon-auth", "--json", str(out)], capture_output=True, text=True,
                         timeout=180)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    text = out.read_text()
    assert "pigeon-tls" in text and "pigeon-auth" in text and "TLS + bearer tokens" in text
