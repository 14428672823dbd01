"""Cluster nodes as real `pigeon serve --etcd` processes over a real etcd: they join, share the bundles by
placement, take a killed node's share once its session ends, move bundles off a drained node and back; and
the refusals — a second node with a live node's id, a data directory of another cluster, an etcd that does not
answer (retried, with nothing served meanwhile)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time

import pytest

from pigeon.bench.procs import free_port, port_open
from pigeon.testing.cluster import await_status, node_process, status, wipe

pytestmark = pytest.mark.e2e

BUNDLES = 16


@pytest.fixture
def cluster(etcd, tmp_path):
    """Start nodes of one cluster (on a wiped key space of the shared etcd); all are killed at the end."""
    wipe(etcd.endpoint)
    started = []

    def start(node_id: str, **kw):
        n = node_process(str(tmp_path), etcd.endpoint, node_id, **kw).start()
        started.append(n)
        return n

    yield start
    for n in started:
        n.kill()


def shares(st) -> dict[str, int]:
    return {r["node"]: r["bundles"] for r in st["nodes"] if r["state"] != "down"}


def settled(nodes: set[str]):
    """Every bundle owned, by exactly `nodes`, none above the bounded-load ceiling."""
    ceiling = math.ceil(1.25 * BUNDLES / len(nodes))

    def ok(st):
        s = shares(st)
        return st["unowned"] == 0 and set(n for n, b in s.items() if b) == nodes and max(s.values()) <= ceiling
    return ok


def test_nodes_share_the_bundles_and_a_killed_nodes_share_moves(cluster, etcd):
    nodes = {i: cluster(i) for i in ("n1", "n2", "n3")}
    st = await_status(etcd.endpoint, settled({"n1", "n2", "n3"}))
    assert st["bundles"] == BUNDLES and st["cluster"]
    assert {r["node"]: r["address"] for r in st["nodes"]} == {i: n.address for i, n in nodes.items()}

    t0 = time.monotonic()
    nodes["n2"].kill()  # kill -9: its session lease runs out, and with it its node and owner keys
    await_status(etcd.endpoint, settled({"n1", "n3"}), timeout=20, what="n2's bundles to move")
    # how long it took is reported (the session's time to live, 5 s by default, and the placement check), not
    # asserted: a test does not time a shared machine
    print(f"bundles of a killed node owned again after {time.monotonic() - t0:.1f} s")

    back = cluster("n2")  # the same id joins again (a new session) and takes its share back
    await_status(etcd.endpoint, settled({"n1", "n2", "n3"}), what="n2 to take its share back")
    assert back.proc.poll() is None


def test_drain_moves_every_bundle_off_a_node_and_undrain_brings_it_back(cluster, etcd):
    for i in ("n1", "n2", "n3"):
        cluster(i)
    await_status(etcd.endpoint, settled({"n1", "n2", "n3"}))

    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "drain", "n3", "--etcd", etcd.endpoint],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    st = await_status(etcd.endpoint, settled({"n1", "n2"}), what="n3 to be drained")
    assert {r["node"]: r["state"] for r in st["nodes"]}["n3"] == "draining"

    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "status", "--etcd", etcd.endpoint, "-f", "json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    from pigeon.storage import formats
    from pigeon.version import __version__

    row = json.loads(out.stdout)["nodes"][2]
    cores = row.pop("cores")  # (none until the node's first load report)
    assert cores is None or cores >= 0
    assert row == {"node": "n3", "address": st["nodes"][2]["address"], "zone": "", "machine": "", "state": "draining",
                   "bundles": 0, "version": __version__, "format": formats.CLUSTER}
    assert json.loads(out.stdout)["format"] == formats.CLUSTER
    check = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "upgrade-check", "--etcd", etcd.endpoint],
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and f"its nodes run {__version__} (format {formats.CLUSTER})" in check.stdout, \
        check.stdout + check.stderr

    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "undrain", "n3", "--etcd", etcd.endpoint],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    await_status(etcd.endpoint, settled({"n1", "n2", "n3"}), what="n3 to take bundles again")

    out = subprocess.run([sys.executable, "-m", "pigeon", "cluster", "drain", "n9", "--etcd", etcd.endpoint],
                         capture_output=True, text=True, timeout=60)
    assert (out.returncode, out.stderr.strip()) == (1, "pigeon: no live node 'n9' in the cluster")


def refused(tmp_path, etcd_endpoint: str, node_id: str, data_dir: str, timeout: float = 30):
    port = free_port()
    out = subprocess.run([sys.executable, "-m", "pigeon", "serve", "--port", str(port), "--data-dir", data_dir,
                          "--etcd", etcd_endpoint, "--node-id", node_id], capture_output=True, text=True,
                         timeout=timeout)
    return out.returncode, out.stderr.strip().splitlines()[-1]


def test_a_second_node_with_a_live_nodes_id_is_refused(cluster, etcd, tmp_path):
    first = cluster("n1")
    code, line = refused(tmp_path, etcd.endpoint, "n1", str(tmp_path / "twin"))
    assert code == 1
    assert line == (f"pigeon: cannot join the cluster: node id n1 is in use by a live node at {first.address}; "
                    "if that node is gone, its session ends within 2 s")
    assert first.proc.poll() is None


def test_a_data_directory_of_another_cluster_is_refused(cluster, etcd, tmp_path):
    cluster("n1")
    data = tmp_path / "elsewhere"
    data.mkdir()
    (data / "cluster-id").write_text("0123456789abcdef\n")
    code, line = refused(tmp_path, etcd.endpoint, "n2", str(data))
    actual = status(etcd.endpoint)["cluster"]
    assert code == 1
    assert line == (f"pigeon: cannot join the cluster: this data directory belongs to cluster 0123456789abcdef, but "
                    f"etcd holds cluster {actual}: start the node with an empty data directory or point it at its "
                    "own cluster's etcd")
    assert (data / "cluster-id").read_text() == "0123456789abcdef\n"  # nothing was changed


def test_an_unreachable_etcd_is_retried_with_a_clear_line_and_nothing_is_served(tmp_path):
    nowhere = f"127.0.0.1:{free_port()}"
    port = free_port()
    log_path = tmp_path / "n1.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, "-m", "pigeon", "serve", "--port", str(port), "--data-dir",
                                 str(tmp_path / "n1"), "--etcd", nowhere, "--node-id", "n1"], stdout=log,
                                stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        lines = []
        while time.monotonic() < deadline:
            lines = [ln for ln in log_path.read_text().splitlines() if "trying again" in ln]
            if len(lines) >= 3:
                break
            time.sleep(0.2)
        assert len(lines) >= 3, log_path.read_text()
        assert f"etcd cannot be reached at {nowhere}" in lines[0]
        assert lines[0].endswith("(this node serves nothing until it has joined)")
        assert proc.poll() is None and not port_open(port)  # still trying, and serving nothing
    finally:
        proc.terminate()
        assert proc.wait(20) == 0  # a stop while waiting for etcd is a clean exit
    assert not os.path.exists(tmp_path / "n1" / "cluster-id")
