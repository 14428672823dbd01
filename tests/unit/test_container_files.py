"""The container files, read offline (no engine needed: `make image-test` builds and runs the image): the
Containerfile keeps the image's promises — not root, /data a volume, ports 8085 and 8086, a HEALTHCHECK that asks
/readyz (run here against a stand-in server), SIGTERM reaching the server as PID 1, setup.py's compiled parts
and constraints.txt's pins in the build — and sets only settings that exist; the compose files parse, set only
settings of pigeon/ops/config.py, and their nodes' settings load into a valid configuration (a cluster's: one
node id each, advertised where the others reach it, over the etcd the file starts). Each check is shown to find
a breach in a sample."""

from __future__ import annotations

import dataclasses
import http.server
import json
import pathlib
import re
import shlex
import subprocess
import sys
import threading

import pytest
import yaml

from pigeon import version
from pigeon.ops import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
CONTAINERFILE = ROOT / "Containerfile"
COMPOSE = sorted((ROOT / "deploy" / "compose").glob("*.yaml"))
SETTINGS = {f"PIGEON_{f.name.upper()}" for f in dataclasses.fields(config.Config)}


def instructions(text: str) -> list[tuple[str, str]]:
    """(KEYWORD, arguments) of a Dockerfile: comment lines dropped (inside a continued instruction too, as the
    builders do), continued lines joined."""
    out, pending = [], ""
    for line in text.splitlines():
        if line.lstrip().startswith("#"):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        line, pending = (pending + line).strip(), ""
        if line:
            keyword, _, args = line.partition(" ")
            out.append((keyword.upper(), args.strip()))
    assert not pending, "the Containerfile ends in a continued line"
    return out


def image_stage(text: str) -> list[tuple[str, str]]:
    """The instructions of the last stage: the image that runs."""
    found = instructions(text)
    last = max(i for i, (k, _) in enumerate(found) if k == "FROM")
    return found[last:]


def values(stage, keyword: str) -> list[str]:
    return [args for k, args in stage if k == keyword]


def image_env(stage) -> dict[str, str]:
    env = {}
    for args in values(stage, "ENV"):
        for word in shlex.split(args):
            name, _, value = word.partition("=")
            env[name] = value
    return env


def exec_form(args: str) -> list[str] | None:
    """The JSON array of an exec-form instruction, None for the shell form."""
    try:
        parsed = json.loads(args)
    except ValueError:
        return None
    return parsed if isinstance(parsed, list) else None


def promises_broken(text: str) -> list[str]:
    """What the image's last stage fails to promise."""
    stage, broken = image_stage(text), []
    users = values(stage, "USER")
    if not users or re.fullmatch(r"(root|0)(:.*)?", users[-1]):
        broken.append("USER: the server would run as root")
    volumes = " ".join(values(stage, "VOLUME"))
    if "/data" not in (exec_form(volumes) or volumes.split()):
        broken.append("VOLUME /data")
    exposed = {p.split("/")[0] for args in values(stage, "EXPOSE") for p in args.split()}
    broken += [f"EXPOSE {p}" for p in ("8085", "8086") if p not in exposed]
    if not any("/readyz" in args for args in values(stage, "HEALTHCHECK")):
        broken.append("HEALTHCHECK on /readyz")
    if values(stage, "STOPSIGNAL")[-1:] != ["SIGTERM"]:
        broken.append("STOPSIGNAL SIGTERM")
    entrypoint = exec_form((values(stage, "ENTRYPOINT") or ["sh"])[-1])
    if not entrypoint or entrypoint[0] not in ("pigeon", "tini", "/usr/bin/tini", "catatonit"):
        # a shell form runs /bin/sh -c as PID 1, which does not pass SIGTERM on: the stop would end in SIGKILL
        broken.append("ENTRYPOINT in exec form: pigeon (or an init) as PID 1, so that SIGTERM reaches the server")
    return broken


def test_the_image_keeps_its_promises():
    assert promises_broken(CONTAINERFILE.read_text()) == []


@pytest.mark.parametrize("change, broken", [
    (("USER 10001:10001", "USER root"), "USER: the server would run as root"),
    (("VOLUME /data", "VOLUME /var/lib/pigeon"), "VOLUME /data"),
    (("EXPOSE 8085 8086", "EXPOSE 8085"), "EXPOSE 8086"),
    (("/readyz', timeout", "/healthz', timeout"), "HEALTHCHECK on /readyz"),
    (("STOPSIGNAL SIGTERM", "STOPSIGNAL SIGKILL"), "STOPSIGNAL SIGTERM"),
    (('ENTRYPOINT ["pigeon"]', "ENTRYPOINT pigeon"), "ENTRYPOINT in exec form"),
])
def test_a_broken_promise_is_found(change, broken):
    text = CONTAINERFILE.read_text()
    assert change[0] in text, f"the sample's text {change[0]!r} is no longer in the Containerfile"
    assert any(b.startswith(broken) for b in promises_broken(text.replace(*change)))


def test_a_user_set_only_in_the_build_stage_is_not_the_image_s():
    text = "FROM a AS build\nUSER 10001\nFROM a\nVOLUME /data\nEXPOSE 8085 8086\n"
    assert "USER: the server would run as root" in promises_broken(text)


def test_both_stages_use_the_base_and_it_defaults_to_debian_s_python_3_11():
    found = instructions(CONTAINERFILE.read_text())
    assert ("ARG", "BASE=python:3.11-slim-bookworm") in found
    froms = values(found, "FROM")
    assert len(froms) == 2 and all(f.split()[0] == "${BASE}" for f in froms), froms


def test_the_build_compiles_setup_py_s_extensions_with_the_pins():
    text = CONTAINERFILE.read_text()
    extensions = re.findall(r'Extension\("([\w.]+)"', (ROOT / "setup.py").read_text())
    assert extensions, "setup.py names no extension"
    build = "\n".join(args for k, args in instructions(text) if k == "RUN")
    # setup.py's extensions are optional: the build imports each, or an image without them would pass unnoticed
    assert all(re.search(rf"import\b[^'\"]*\b{re.escape(e)}\b", build) for e in extensions), extensions
    assert "PIP_CONSTRAINT=/src/constraints.txt" in text and "COPY constraints.txt" in text


def test_the_image_s_settings_exist_and_load_only_with_insecure_said_out_loud():
    env = {k: v for k, v in image_env(image_stage(CONTAINERFILE.read_text())).items() if k.startswith("PIGEON_")}
    assert set(env) <= SETTINGS, set(env) - SETTINGS
    loaded = config.load(env={**env, "PIGEON_INSECURE": "true"})
    assert (loaded.host, loaded.port, loaded.http_port, loaded.data_dir) == ("0.0.0.0", 8085, 8086, "/data")
    with pytest.raises(ValueError, match="without authentication"):  # the image does not open itself silently
        config.load(env=env)


class _Probe(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self):  # noqa: N802 — http.server's name
        self.send_response(self.status if self.path == "/readyz" else 404)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def readyz():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), type("Probe", (_Probe,), {}))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def healthcheck(env: dict[str, str]) -> int:
    """Run the image's HEALTHCHECK command here (this interpreter for the image's python3)."""
    (args,) = values(image_stage(CONTAINERFILE.read_text()), "HEALTHCHECK")
    command = exec_form(args.split(" CMD ", 1)[1])
    assert command and command[0] == "python3", args
    return subprocess.run([sys.executable, *command[1:]], env=env, capture_output=True, timeout=30).returncode


@pytest.mark.parametrize("status, healthy", [(200, True), (503, False)])
def test_the_healthcheck_follows_readyz(readyz, status, healthy):
    readyz.RequestHandlerClass.status = status
    port = readyz.server_address[1]
    assert (healthcheck({"PIGEON_HTTP_PORT": str(port)}) == 0) is healthy
    # -1, the default: the gRPC port + 1
    assert (healthcheck({"PIGEON_HTTP_PORT": "-1", "PIGEON_PORT": str(port - 1)}) == 0) is healthy


def test_the_healthcheck_fails_where_nothing_answers(readyz):
    port = readyz.server_address[1]
    readyz.shutdown()
    readyz.server_close()
    assert healthcheck({"PIGEON_HTTP_PORT": str(port)}) != 0


def test_the_build_context_holds_what_the_build_copies_and_not_the_virtualenv():
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    assert ignore[0] == "*", "the context is an allow-list: everything else (.venv, data, caches) stays out"
    allowed = {line[1:] for line in ignore if line.startswith("!")}
    for args in values(instructions(CONTAINERFILE.read_text()), "COPY"):
        if args.startswith("--from"):
            continue
        *sources, _ = args.split()
        for source in sources:
            assert source in allowed and (ROOT / source).exists(), f"COPY {source}: not in the build context"
    assert {"**/*.so", "**/__pycache__"} <= set(ignore), "an in-place build's objects would enter the image"


# ---- compose ----


def compose(path: pathlib.Path) -> dict:
    return yaml.safe_load(path.read_text())


def environment(service: dict) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.partition("=")[::2] for item in env)
    return {k: str(v) for k, v in env.items()}


def pigeon_services(doc: dict) -> dict[str, dict]:
    return {name: s for name, s in doc["services"].items() if s.get("image", "").startswith("${PIGEON_IMAGE")}


def unknown_settings(doc: dict) -> list[str]:
    return sorted(f"{name}: {k}" for name, s in pigeon_services(doc).items() for k in environment(s)
                  if k.startswith("PIGEON_") and k not in SETTINGS)


def node_config(service: dict) -> config.Config:
    """What `pigeon serve` in the service's container runs with: the image's PIGEON_* and the service's."""
    image = image_env(image_stage(CONTAINERFILE.read_text()))
    return config.load(env={**{k: v for k, v in image.items() if k.startswith("PIGEON_")}, **environment(service)})


def test_the_compose_files_are_there():
    assert {p.name for p in COMPOSE} >= {"single.yaml", "cluster.yaml"}


@pytest.mark.parametrize("path", COMPOSE, ids=lambda p: p.name)
def test_a_compose_file_sets_only_settings_that_exist_and_they_load(path):
    doc = compose(path)
    nodes = pigeon_services(doc)
    assert nodes, f"{path.name} runs no Pigeon"
    assert unknown_settings(doc) == []
    for name, service in nodes.items():
        assert service["image"] == "${PIGEON_IMAGE:-pigeon:" + version.__version__ + "}", \
            f"{name}: the default image is this version's (`make image` tags pigeon:{version.__version__})"
        node_config(service)  # raises ValueError on a setting that does not load
        mounts = [v for v in service.get("volumes", []) if v.endswith(":/data")]
        assert len(mounts) == 1 and mounts[0].split(":")[0] in (doc.get("volumes") or {}), \
            f"{name}: /data on a named volume of the file"


def test_a_misspelt_setting_is_found():
    doc = compose(ROOT / "deploy" / "compose" / "single.yaml")
    (service,) = pigeon_services(doc).values()
    service["environment"]["PIGEON_DATADIR"] = "/data"
    assert unknown_settings(doc) == ["pigeon: PIGEON_DATADIR"]


def test_the_cluster_s_nodes_find_each_other_and_etcd():
    doc = compose(ROOT / "deploy" / "compose" / "cluster.yaml")
    nodes = {name: node_config(s) for name, s in pigeon_services(doc).items()}
    assert len(nodes) == 3
    assert len({c.node_id for c in nodes.values()}) == 3, "one node id each"
    assert len({c.zone for c in nodes.values()}) == 3
    (etcd_name,) = set(doc["services"]) - set(nodes)
    etcd_command = " ".join(doc["services"][etcd_name]["command"])
    for name, c in nodes.items():
        service = doc["services"][name]
        assert c.etcd and c.replicas == 3 and c.ack_quorum == 2
        assert c.advertise == f"{service['hostname']}:{c.port}", f"{name}: advertised where the others reach it"
        assert all(endpoint.split("//")[-1].split(":")[0] == etcd_name for endpoint in c.etcd.split(","))
        assert f"--advertise-client-urls={c.etcd}" in etcd_command
    published = [p.rsplit(":", 2)[1] for s in pigeon_services(doc).values() for p in s["ports"]]
    assert published == [str(8085 + i) for i in range(6)], "make cluster's layout: node i on 8085 + 2(i - 1)"
