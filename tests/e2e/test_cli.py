"""The command-line verbs against the real server."""

import json
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.e2e


def run(server, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pigeon", *args, "--address", server.address, "--project", "cli"],
                          capture_output=True, text=True, timeout=60)


def pigeon(server, *args) -> str:
    out = run(server, *args)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_topics_subscriptions_publish_pull_and_queue_verbs(server):
    pigeon(server, "topics", "create", "cli-topic")
    pigeon(server, "subscriptions", "create", "cli-sub", "--topic", "cli-topic")
    assert "projects/cli/topics/cli-topic" in pigeon(server, "topics", "list")
    assert "cli-sub" in pigeon(server, "subscriptions", "list")
    mid = pigeon(server, "publish", "cli-topic", "hello", "-A", "k=v").strip()
    later = pigeon(server, "publish", "cli-topic", "later", "--delay", "5s").strip()
    (line,) = pigeon(server, "pull", "cli-sub", "--ack").splitlines()
    got = json.loads(line)
    assert (got["message_id"], got["data"], got["attributes"]) == (mid, "hello", {"k": "v"})
    assert json.loads(pigeon(server, "queue", "peek", "cli-sub", later))["state"] == "scheduled"
    time.sleep(5)
    lines = pigeon(server, "queue", "take", "cli-sub", "--lock", "60").splitlines()
    assert len(lines) == 1, lines
    taken = json.loads(lines[0])
    assert taken["data"] == "later"
    pigeon(server, "queue", "reschedule", "cli-sub", taken["ack_id"], "--delay", "3600")
    assert json.loads(pigeon(server, "queue", "peek", "cli-sub", later))["state"] == "scheduled"
    assert pigeon(server, "queue", "delete", "cli-sub", later).strip() == "1"
    peek = run(server, "queue", "peek", "cli-sub", later)
    if peek.returncode == 0:  # still retained: shown as acked
        assert json.loads(peek.stdout)["state"] == "acked"
    else:  # the upkeep (every few seconds) already let go of the acked batch
        assert "is not retained" in peek.stderr, peek.stderr
