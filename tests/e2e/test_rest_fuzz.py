"""The REST API fuzzed from its own OpenAPI document with schemathesis: every operation, generated and mutated
requests (coverage, fuzzing and stateful phases), and not one 5xx; the server serves on afterwards and logged no
traceback. `make test` runs a few derandomized examples per operation; `make fuzz` many random ones
(REST_FUZZ_EXAMPLES)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request

import pytest

pytestmark = pytest.mark.e2e

EXAMPLES = int(os.environ.get("REST_FUZZ_EXAMPLES", "5"))


def _call(base: str, method: str, path: str, body: dict | None) -> dict:
    req = urllib.request.Request(base + path, data=None if body is None else json.dumps(body).encode(), method=method,
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read() or b"{}")


def _create_the_examples(base: str) -> None:
    """The resources the document's path examples name (`my-project`, `my-topic`, …), with a few messages: the
    examples phase's requests then reach live resources, not only lookups that fail."""
    p = "/v1/projects/my-project"
    _call(base, "PUT", f"{p}/topics/my-topic", {})
    _call(base, "PUT", f"{p}/subscriptions/my-subscription", {"topic": f"{p[4:]}/topics/my-topic"})
    _call(base, "POST", f"{p}/topics/my-topic:publish", {"messages": [{"data": "aGVsbG8="}] * 20})
    _call(base, "PUT", f"{p}/snapshots/my-snapshot", {"subscription": f"{p[4:]}/subscriptions/my-subscription"})
    _call(base, "POST", f"{p}/schemas?schemaId=my-schema", {"type": "AVRO", "definition": json.dumps(
        {"type": "record", "name": "R", "fields": [{"name": "a", "type": "string"}]})})
    assert _call(base, "GET", f"{p}/subscriptions/my-subscription", None)["topic"].endswith("/my-topic")


def test_no_server_errors(server_factory, tmp_path):
    srv = server_factory(http=True)
    _create_the_examples(srv.http)
    st = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or "schemathesis"
    # 501 is UNIMPLEMENTED: what Pigeon answers, on purpose, for a field it does not support (a topic's
    # kmsKeyName, …) rather than accept and ignore it — not a server error. A bug answers 500 (api.errors).
    config = tmp_path / "schemathesis.toml"
    config.write_text('[checks.not_a_server_error]\nexpected-statuses = ["2XX", "3XX", "4XX", "501"]\n')
    args = [st, "--config-file", str(config), "run", f"{srv.http}/openapi.json", "--checks", "not_a_server_error",
            "--max-examples", str(EXAMPLES), "--no-color"]
    if "REST_FUZZ_EXAMPLES" not in os.environ:
        args.append("--generation-deterministic")
    out = subprocess.run(args, capture_output=True, text=True, timeout=3500, cwd=tmp_path)  # its cache goes there
    tail = "\n".join(out.stdout.splitlines()[-40:])
    if os.environ.get("FUZZ_REPORT"):
        print(tail)
    assert out.returncode == 0, tail
    assert " passed" in tail and "Server error" not in tail, tail
    with urllib.request.urlopen(srv.http + "/healthz", timeout=10) as r:
        assert r.status == 200
    log = open(srv.log_path).read()
    assert "Traceback" not in log, log[-5000:]
