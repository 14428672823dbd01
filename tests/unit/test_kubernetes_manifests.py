"""deploy/kubernetes/*.yaml: every object validates offline against Kubernetes' own schemas (kubernetes-validate,
strict: a misspelt field is an error) for the oldest and newest versions it knows of that we claim, and the
objects fit together — the node's settings, as the pods get them, load into a valid Pigeon configuration of a
cluster over etcd.yaml's members; readiness is gRPC health and liveness is not readiness; nodes spread over
machines and zones; the disruption budget keeps a write quorum."""

from __future__ import annotations

import ast
import copy
import functools
import pathlib
import re

import kubernetes_validate
import pytest
import yaml

from pigeon.ops import config

ROOT = pathlib.Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
VERSIONS = ("1.29.0", kubernetes_validate.latest_version())  # gRPC probes are GA from 1.27


def documents(path: pathlib.Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


@functools.cache
def objects() -> dict[tuple[str, str], dict]:
    """(kind, name) → the object, read once (a test that changes one changes a copy)."""
    return {(d["kind"], d["metadata"]["name"]): d for p in MANIFESTS for d in documents(p)}


@pytest.mark.parametrize("version", VERSIONS)
def test_every_object_validates_strictly(version):
    assert MANIFESTS, "no manifests found"
    for path in MANIFESTS:
        for doc in documents(path):
            kubernetes_validate.validate(doc, version, strict=True)


def test_a_misspelt_field_is_refused():
    sts = copy.deepcopy(objects()[("StatefulSet", "pigeon")])
    container = sts["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(sts, VERSIONS[-1], strict=True)


def _expand(value: str, env: dict[str, str]) -> str:
    return re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)


def node_settings(pod_name: str = "pigeon-0", namespace: str = "default", zone: str = "zone-a") -> config.Config:
    """What `pigeon serve` of one pod runs with: its PIGEON_* variables as Kubernetes expands them, and the
    settings file the zone init container writes."""
    spec = objects()[("StatefulSet", "pigeon")]["spec"]["template"]["spec"]
    (container,) = spec["containers"]
    env = {"POD_NAME": pod_name, "POD_NAMESPACE": namespace}
    for e in container["env"]:
        if "value" in e:
            env[e["name"]] = _expand(e["value"], env)
    argv = container["command"] + container["args"]
    assert argv[:2] == ["pigeon", "serve"] and argv[2] == "--config"
    (init,) = spec["initContainers"]
    assert argv[3] in init["args"][0], "the init container writes the file the node reads"
    ast.parse(init["args"][0])  # (the script runs against the API server; here it must at least be Python)
    return config.load(None, env={k: v for k, v in env.items() if k.startswith("PIGEON_")}, zone=zone)


def test_the_nodes_settings_make_a_valid_cluster_node_of_etcd_yaml():
    cfg = node_settings()
    etcd = objects()[("StatefulSet", "etcd")]
    members = [f"http://etcd-{i}.{etcd['spec']['serviceName']}:2379" for i in range(etcd["spec"]["replicas"])]
    assert cfg.etcd.split(",") == members
    assert cfg.node_id == "pigeon-0" and cfg.zone == "zone-a"
    sts = objects()[("StatefulSet", "pigeon")]
    headless = objects()[("Service", sts["spec"]["serviceName"])]
    assert headless["spec"]["clusterIP"] == "None" and headless["spec"]["publishNotReadyAddresses"] is True
    assert cfg.advertise == f"pigeon-0.{sts['spec']['serviceName']}.default.svc:{cfg.port}"
    ports = {p["name"]: p["containerPort"] for p in sts["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert (ports["grpc"], ports["http"], ports["append"]) == (cfg.port, cfg.http_port, cfg.append_port)
    assert cfg.replicas <= sts["spec"]["replicas"]


def test_probes_readiness_is_grpc_health_and_liveness_is_not_readiness():
    c = objects()[("StatefulSet", "pigeon")]["spec"]["template"]["spec"]["containers"][0]
    assert c["readinessProbe"]["grpc"]["port"] == node_settings().port
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["startupProbe"]["httpGet"]["path"] == "/healthz"


def test_nodes_spread_over_machines_and_zones_and_the_budget_keeps_a_quorum():
    sts = objects()[("StatefulSet", "pigeon")]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    anti = sts["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    assert [t["topologyKey"] for t in anti["requiredDuringSchedulingIgnoredDuringExecution"]] == \
        ["kubernetes.io/hostname"]
    assert [t["podAffinityTerm"]["topologyKey"] for t in anti["preferredDuringSchedulingIgnoredDuringExecution"]] \
        == ["topology.kubernetes.io/zone"]
    budget = objects()[("PodDisruptionBudget", "pigeon")]["spec"]
    assert budget["selector"]["matchLabels"].items() <= labels.items()
    cfg = node_settings()
    assert budget["maxUnavailable"] <= cfg.replicas - cfg.ack_quorum
    for name in ("pigeon", "pigeon-client"):
        assert objects()[("Service", name)]["spec"]["selector"].items() <= labels.items()
