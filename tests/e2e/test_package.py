"""Pigeon installed as a user installs it, without make: a wheel built from the work tree (`pip wheel`, the Cython
parts compiled by setup.py) on Python 3.11 and each newer CPython found, installed into a fresh virtualenv, then
`pigeon --version` and `pigeon serve` answering /healthz and a publish and pull over REST; and a Spark executor's
install — the wheel without the server's dependencies, plus what the connector imports — reading the node.

Slow (each fresh virtualenv downloads the dependencies from the package index, a minute or more each), so it runs
only under `make package-check` (PIGEON_PACKAGE_CHECK=1); PIGEON_PACKAGE_PYTHONS=path,path chooses the
interpreters. Everything is made under the test's temporary directory: nothing is built in the work tree."""

from __future__ import annotations

import base64
import glob
import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
import zipfile

import pytest

from pigeon.testing.server import free_port
from pigeon.version import __version__

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(1800), pytest.mark.skipif(
    not os.environ.get("PIGEON_PACKAGE_CHECK"),
    reason="slow (fresh virtualenvs download every dependency): run by `make package-check`")]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# What a Spark executor installs beside the wheel (pip install --no-deps): what pigeon.spark's reading and writing
# side and pigeon.client import, and none of the server's (uvloop, aiohttp, V8, etcd, …). pyspark it has already.
EXECUTOR_NEEDS = ["grpcio>=1.85.1,<2", "protobuf>=7.36.2,<8", "google-cloud-pubsub>=2.44.0,<3",
                  "pyarrow>=26.0.1,<27", "numpy>=2.4.6,<3"]
SERVER_ONLY = ["uvloop", "aiohttp", "py_mini_racer", "aetcd", "fastavro", "typer", "prometheus_client"]


def _runs(python: str) -> bool:
    try:
        return subprocess.run([python, "-c", "import ensurepip, venv"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def pythons() -> list[str]:
    """Python 3.11 and each newer CPython on this machine (Debian's, pyenv's, or on PATH), one per minor version."""
    if os.environ.get("PIGEON_PACKAGE_PYTHONS"):
        return os.environ["PIGEON_PACKAGE_PYTHONS"].split(",")
    pyenv = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    found = []
    for minor in range(11, 20):
        candidates = [f"/usr/bin/python3.{minor}", *sorted(glob.glob(f"{pyenv}/versions/3.{minor}.*/bin/python3.{minor}")),
                      shutil.which(f"python3.{minor}")]
        found += [c for c in candidates if c and os.path.exists(c) and _runs(c)][:1]
    return found


PYTHONS = pythons() if os.environ.get("PIGEON_PACKAGE_CHECK") else []


def run(*cmd: str, cwd: str, timeout: float = 900) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p.stdout


def venv(python: str, path: str) -> str:
    run(python, "-m", "venv", path, cwd="/tmp")
    run(f"{path}/bin/python", "-m", "pip", "install", "--quiet", "--upgrade", "pip", cwd="/tmp")
    return f"{path}/bin"


def source_copy(dest: str) -> str:
    """The committed tree (HEAD) unpacked out of the checkout: what a release would build, and nothing is built in
    the work tree."""
    os.makedirs(dest)
    archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", dest], input=archive.stdout, check=True)
    return dest


_wheels: dict[str, str] = {}


def wheel(python: str, tmp: str) -> str:
    """The wheel built with `python` (its own tag: the compiled parts are per interpreter)."""
    if python not in _wheels:
        bin_ = venv(python, f"{tmp}/build-venv")
        src = source_copy(f"{tmp}/src")
        t0 = time.monotonic()
        run(f"{bin_}/pip", "wheel", "--quiet", "--no-deps", "-w", f"{tmp}/dist", src, cwd=tmp)
        (whl,) = glob.glob(f"{tmp}/dist/pigeon-*.whl")
        names = zipfile.ZipFile(whl).namelist()
        for part in ("pigeon/core/_compiled.", "pigeon/node/_commit.", "pigeon/spark/_decode."):
            assert any(n.startswith(part) and n.endswith(".so") for n in names), f"{part}*.so not built into {whl}"
        assert "pigeon/api/console/console.js" in names and any(n.endswith(".proto") for n in names)
        assert not any(n.startswith("tests/") for n in names)
        shutil.rmtree(src)
        print(f"\n{os.path.basename(whl)}: built in {time.monotonic() - t0:.0f} s, {os.path.getsize(whl) // 1024} KiB")
        shutil.rmtree(f"{tmp}/build-venv")
        _wheels[python] = whl
    return _wheels[python]


def http(base: str, method: str, path: str, body=None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    try:
        req = urllib.request.Request(base + path, data=data, method=method, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, json.loads(r.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, {"error": e.read().decode(errors="replace")}


def wait_healthy(base: str, proc: subprocess.Popen, log: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"pigeon serve exited {proc.returncode}:\n{open(log).read()[-3000:]}"
        try:
            with urllib.request.urlopen(base + "/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"/healthz did not answer within 60 s:\n{open(log).read()[-3000:]}")


@pytest.fixture(autouse=True)
def _cleanup(tmp_path):
    """The virtualenvs go at the end (hundreds of MB each); the wheel stays for the next test."""
    yield
    for d in ("venv", "server", "executor", "src", "build-venv"):
        shutil.rmtree(tmp_path / d, ignore_errors=True)


@pytest.fixture
def serving(tmp_path):
    """Start `bin/pigeon serve` of a virtualenv; SIGTERM at the end (it must stop cleanly)."""
    procs = []

    def start(bin_: str) -> tuple[str, str]:
        port, http_port, log = free_port(), free_port(), str(tmp_path / "serve.log")
        with open(log, "wb") as out:
            procs.append(subprocess.Popen([f"{bin_}/pigeon", "serve", "--host", "127.0.0.1", "--port", str(port),
                                           "--http-port", str(http_port), "--data-dir", str(tmp_path / "data")],
                                          cwd=tmp_path, stdout=out, stderr=subprocess.STDOUT))
        base = f"http://127.0.0.1:{http_port}"
        wait_healthy(base, procs[-1], log)
        return f"127.0.0.1:{port}", base

    yield start
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                assert p.wait(30) == 0, "pigeon serve did not stop cleanly on SIGTERM"
            finally:
                p.kill()


def publish_and_pull(base: str) -> None:
    P = "/v1/projects/pkg"
    for method, path, body in (("PUT", f"{P}/topics/orders", None),
                               ("PUT", f"{P}/subscriptions/worker", {"topic": "projects/pkg/topics/orders"}),
                               ("POST", f"{P}/topics/orders:publish",
                                {"messages": [{"data": base64.b64encode(b"from the wheel").decode()}]})):
        code, answer = http(base, method, path, body)
        assert code == 200, (method, path, code, answer)
    _, got = http(base, "POST", f"{P}/subscriptions/worker:pull", {"maxMessages": 10})
    assert [base64.b64decode(m["message"]["data"]) for m in got["receivedMessages"]] == [b"from the wheel"]


@pytest.mark.parametrize("python", PYTHONS or [pytest.param("", marks=pytest.mark.skip("no Python ≥ 3.11 found"))])
def test_wheel_installs_and_serves(python, tmp_path, serving):
    whl = wheel(python, str(tmp_path))
    t0 = time.monotonic()
    bin_ = venv(python, str(tmp_path / "venv"))
    run(f"{bin_}/pip", "install", "--quiet", whl, cwd=str(tmp_path))  # as a user would: no constraints file
    print(f"installed with its dependencies in {time.monotonic() - t0:.0f} s")
    run(f"{bin_}/pip", "check", cwd=str(tmp_path))
    assert run(f"{bin_}/pigeon", "--version", cwd=str(tmp_path)).split()[-1] == __version__
    where = run(f"{bin_}/python", "-c", "import pigeon, pigeon.core.hot as h, pigeon.node.disk as d; "
                "print(pigeon.__file__, h.COMPILED, d.COMPILED)", cwd=str(tmp_path)).split()
    assert where[0].startswith(str(tmp_path / "venv")) and where[1:] == ["True", "True"], where
    _, base = serving(bin_)
    publish_and_pull(base)
    versions = run(f"{bin_}/pip", "list", "--format=freeze", cwd=str(tmp_path))
    print(run(f"{bin_}/python", "--version", cwd=str(tmp_path)).strip(), "; resolved:",
          ", ".join(v for v in versions.split() if v.lower().startswith(("grpcio==", "protobuf==", "google-cloud-pubsub==",
                                                                         "mini-racer==", "uvloop==", "cryptography=="))))


@pytest.mark.skipif(not PYTHONS, reason="no Python ≥ 3.11 found")
def test_spark_executor_installs_without_the_server(tmp_path, serving):
    """The wheel with --no-deps plus EXECUTOR_NEEDS: the connector's client side reads a node; none of the
    server's dependencies is there."""
    python = PYTHONS[0]
    whl = wheel(python, str(tmp_path))
    server_bin = venv(python, str(tmp_path / "server"))
    run(f"{server_bin}/pip", "install", "--quiet", whl, cwd=str(tmp_path))
    address, base = serving(server_bin)
    publish_and_pull(base)

    bin_ = venv(python, str(tmp_path / "executor"))
    run(f"{bin_}/pip", "install", "--quiet", "--no-deps", whl, cwd=str(tmp_path))
    run(f"{bin_}/pip", "install", "--quiet", *EXECUTOR_NEEDS, cwd=str(tmp_path))
    script = f"""
import importlib.util
from pigeon.client import PigeonClient as QueueClient
from pigeon.spark import arrow, options, publish
from pigeon.spark.client import PigeonClient
offsets = PigeonClient({address!r}).latest_offsets("projects/pkg/topics/orders")
print(offsets.shard_count, sum(s.latest - s.earliest for s in offsets.shards))
print([m for m in {SERVER_ONLY!r} if importlib.util.find_spec(m)])
"""
    out = run(f"{bin_}/python", "-c", script, cwd=str(tmp_path)).splitlines()
    assert out[-1] == "[]", f"server dependencies installed on the executor: {out[-1]}"
    du = run("du", "-sm", str(tmp_path / "executor"), cwd=str(tmp_path)).split()
    print(f"executor virtualenv {du[0]} MB (pyarrow and numpy the bulk), none of {', '.join(SERVER_ONLY)}; "
          f"latest offsets (shards, messages): {out[0]}")
