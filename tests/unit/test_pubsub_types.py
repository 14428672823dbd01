"""pigeon.core.pubsub_types: Pigeon's modules get Pub/Sub's message types without running the client library's
package `__init__` (a server never loads the generated clients), and a process that loaded them and then makes a
client — a test, a tool — still finds the whole package. Each case runs in a fresh interpreter: imports are
process-wide."""

from __future__ import annotations

import subprocess
import sys


def _run(code: str) -> str:
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_the_server_side_loads_the_types_and_not_the_clients():
    got = _run("import sys, pigeon.api.server, pigeon.broker.state\n"
               "print(sorted(m for m in sys.modules if m.startswith('google.pubsub_v1.services.publisher.client')))")
    assert got == "[]"


def test_a_client_made_after_pigeon_was_loaded_finds_the_whole_package():
    got = _run("import pigeon.broker.state\n"
               "from google.cloud import pubsub_v1\n"
               "import google.pubsub_v1 as g\n"
               "print(pubsub_v1.PublisherClient.__name__, g.PubsubMessage.__name__, g.types.PubsubMessage.__name__)")
    assert got == "PublisherClient PubsubMessage PubsubMessage"
