"""`pigeon probe` against a real server: it publishes at a steady rate, receives everything it sent, measures each
message, times creating and deleting a topic and a subscription against the control plane's SLO, serves its
metrics, and says so in its JSON summary; against a node that is gone it reports failures
and exits non-zero; a secured node it reaches with a CA and a token, and a refused token it names."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

import pytest

from pigeon.bench.procs import free_port
from pigeon.cli.probe import CONTROL_OPERATIONS, Prober
from tests.e2e.security_kit import Kit

pytestmark = pytest.mark.e2e


def probe(target: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "pigeon", "probe", "--target", target, "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def test_the_probe_sees_every_message_and_exports_its_figures(server):
    port = free_port()
    p = probe(server.address, "--rate", "40", "--duration", "4", "--metrics-port", str(port))
    scraped: list[str] = []

    def scrape():
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not scraped:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
                    text = r.read().decode()
                if "pigeon_probe_received_total 1" in text or "pigeon_probe_latency_seconds_count" in text \
                        and "pigeon_probe_received_total 0.0" not in text:
                    scraped.append(text)
            except OSError:
                pass
            time.sleep(0.3)
    t = threading.Thread(target=scrape)
    t.start()
    out, _ = p.communicate(timeout=60)
    t.join()
    s = json.loads(out.strip().splitlines()[-1])
    assert p.returncode == 0, s
    assert s["sent"] >= 100 and s["received"] == s["sent"], s
    assert s["lost"] == 0 and s["publish_failures"] == 0
    assert s["p50_ms"] > 0 and s["p99_ms"] >= s["p50_ms"]
    assert s["control_calls"] >= 4 and s["control_failures"] == 0, s  # (a round at the start)
    assert set(s["control_max_ms"]) == set(CONTROL_OPERATIONS) and min(s["control_max_ms"].values()) > 0
    assert scraped and "pigeon_probe_latency_seconds_bucket" in scraped[0]
    assert 'pigeon_probe_control_failures_total{operation="create_subscription"} 0.0' in scraped[0]


def test_the_control_plane_is_timed_against_its_slo_and_a_failed_call_counts(server):
    from prometheus_client import CollectorRegistry

    reg = CollectorRegistry()
    p = Prober(server.address, "probe-control", 1, 5, reg)
    strict = Prober(server.address, "probe-control", 1, 5, CollectorRegistry(), control_slo_s=0.0)
    for probe_ in (p, strict):
        probe_.setup()
        probe_.check_control_plane()
    assert p.counts["control_calls"] == 4 and p.counts["control_failures"] == 0
    assert reg.get_sample_value("pigeon_probe_control_latency_seconds_count", {"operation": "delete_topic"}) == 1
    assert strict.counts["control_failures"] == 4, "every call is slower than an SLO of 0 s"
    server.kill()
    p.check_control_plane()  # the node is gone: the create fails, and nothing else is tried
    assert p.counts["control_calls"] == 5 and p.counts["control_failures"] == 1
    assert reg.get_sample_value("pigeon_probe_control_failures_total", {"operation": "create_topic"}) == 1
    for probe_ in (p, strict):
        probe_.sub.close()


def test_a_probe_of_a_node_that_is_gone_fails(tmp_path):
    p = probe(f"127.0.0.1:{free_port()}", "--rate", "5", "--duration", "2", "--metrics-port", "0", "--deadline", "2")
    out, _ = p.communicate(timeout=120)
    assert p.returncode != 0


def test_the_probe_reaches_a_node_with_tls_and_tokens_and_says_when_its_token_is_refused(server_factory, tmp_path):
    kit = Kit(str(tmp_path / "pki"))
    srv = server_factory(extra=kit.serve_args())
    target = srv.address.replace("127.0.0.1", "localhost")  # the name the server's certificate carries
    (tmp_path / "token").write_text(kit.admin_token + "\n")

    def run(*access: str, env: dict | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "pigeon", "probe", "--target", target, "--json", "--rate", "20",
                               "--duration", "2", "--metrics-port", "0", "--deadline", "5", *access],
                              capture_output=True, text=True, timeout=60, env=env)

    ok = run("--tls-ca", kit.ca_path, "--token-file", str(tmp_path / "token"))
    s = json.loads(ok.stdout.strip().splitlines()[-1])
    assert ok.returncode == 0, ok.stderr
    assert s["sent"] >= 20 and s["received"] == s["sent"] and s["lost"] == 0, s
    # the token from the environment, as the global options read it
    env = {**os.environ, "PIGEON_TOKEN": "not-a-token", "PIGEON_CA_FILE": kit.ca_path}
    bad = run(env=env)
    assert bad.returncode == 2
    assert "refused the probe's credentials (UNAUTHENTICATED" in " ".join(bad.stderr.split()), bad.stderr
    assert "error" in json.loads(bad.stdout.strip().splitlines()[-1])
    # a setting that cannot work is the command line's mistake, said before anything is called
    unreadable = run("--tls-ca", str(tmp_path / "no-such-ca.pem"), "--token", kit.admin_token)
    assert unreadable.returncode == 2 and "cannot read the CA file" in unreadable.stderr
