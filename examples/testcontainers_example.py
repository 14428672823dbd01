"""Pigeon in your own tests, Testcontainers-style: a pytest fixture starts the image (the Containerfile at the
repository's root) on free ports of the host's loopback, waits for /readyz, points the official client at it
through PUBSUB_EMULATOR_HOST, and stops it with SIGTERM when the tests are done.

    make image                                           # builds pigeon:<version>
    pytest examples/testcontainers_example.py            # the fixture and a test that uses it
    python examples/testcontainers_example.py            # the same, plus the image's own checks: `make image-test`

Environment: PIGEON_IMAGE (default pigeon:0.1.0) and CONTAINER_ENGINE (default podman where it is on the PATH,
else docker). Nothing here is Pigeon's code: copy the fixture into your conftest.py.

With the testcontainers package instead (Docker's API, which podman's socket serves too) the fixture's body is:

    from testcontainers.core.container import DockerContainer
    from testcontainers.core.waiting_utils import wait_for_logs

    with DockerContainer("pigeon:0.1.0").with_env("PIGEON_INSECURE", "true").with_exposed_ports(8085) as pigeon:
        wait_for_logs(pigeon, "pigeon: listening on")
        os.environ["PUBSUB_EMULATOR_HOST"] = f"{pigeon.get_container_host_ip()}:{pigeon.get_exposed_port(8085)}"
        yield
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest

IMAGE = os.environ.get("PIGEON_IMAGE", "pigeon:0.1.0")
ENGINE = os.environ.get("CONTAINER_ENGINE") or ("podman" if shutil.which("podman") else "docker")
READY_S = 60.0  # a fresh data directory is ready in about a second; the rest is the engine starting the container
STOP_S = 30  # SIGTERM, then this long before the engine kills it


def engine(*args: str, timeout: float = 60.0) -> str:
    done = subprocess.run([ENGINE, *args], capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{ENGINE} {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()}")
    return done.stdout.strip()


def mapped(container: str, port: int) -> str:
    """host:port the engine published the container's `port` at (`port` prints e.g. 127.0.0.1:40123)."""
    return engine("port", container, f"{port}/tcp").splitlines()[0].replace("0.0.0.0", "127.0.0.1")


@contextlib.contextmanager
def pigeon_container(image: str = IMAGE, **settings: str):
    """A node of `image` on free ports of 127.0.0.1, with PIGEON_<NAME> `settings`; yields (container id, gRPC
    host:port, HTTP base URL) once /readyz answers 200. Stopped with SIGTERM and removed with its volume after."""
    env = {"PIGEON_INSECURE": "true", **settings}  # open, as the emulator is, but published on loopback only
    flags = [f"--env={k}={v}" for k, v in env.items()]
    container = engine("run", "--detach", f"--name=pigeon-test-{uuid.uuid4().hex[:8]}", "--publish=127.0.0.1::8085",
                       "--publish=127.0.0.1::8086", *flags, image)
    try:
        grpc_at, http = mapped(container, 8085), f"http://{mapped(container, 8086)}"
        deadline = time.monotonic() + READY_S
        while True:
            try:
                with urllib.request.urlopen(f"{http}/readyz", timeout=2):
                    break
            except OSError:  # refused, reset, or 503 (HTTPError) while it starts
                if time.monotonic() > deadline:
                    raise RuntimeError(f"not ready in {READY_S:g} s:\n{engine('logs', container)}") from None
                time.sleep(0.2)
        yield container, grpc_at, http
    finally:
        with contextlib.suppress(Exception):
            engine("stop", f"--time={STOP_S}", container, timeout=STOP_S + 30)
        with contextlib.suppress(Exception):
            engine("rm", "--volumes", container)


@pytest.fixture(scope="module")
def pubsub_emulator_host():
    """PUBSUB_EMULATOR_HOST of a fresh Pigeon for this module's tests."""
    if not shutil.which(ENGINE):
        pytest.skip(f"no container engine ({ENGINE}) on this machine")
    with pigeon_container() as (_, grpc_at, _http):
        before = os.environ.get("PUBSUB_EMULATOR_HOST")
        os.environ["PUBSUB_EMULATOR_HOST"] = grpc_at
        try:
            yield grpc_at
        finally:
            if before is None:
                os.environ.pop("PUBSUB_EMULATOR_HOST", None)
            else:
                os.environ["PUBSUB_EMULATOR_HOST"] = before


def publish_and_pull(project: str = "my-project") -> list[bytes]:
    """What an application does: a topic, a subscription, three messages published and pulled back."""
    from google.cloud import pubsub_v1

    publisher, subscriber = pubsub_v1.PublisherClient(), pubsub_v1.SubscriberClient()
    topic = publisher.topic_path(project, "orders")
    subscription = subscriber.subscription_path(project, "orders-worker")
    publisher.create_topic(name=topic)
    subscriber.create_subscription(name=subscription, topic=topic)
    for i in range(3):
        publisher.publish(topic, f"order {i}".encode(), customer="c-42").result(timeout=30)
    received: list = []
    deadline = time.monotonic() + 30
    while len(received) < 3 and time.monotonic() < deadline:
        response = subscriber.pull(subscription=subscription, max_messages=10, timeout=10)
        received += response.received_messages
    if received:
        subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in received])
    return sorted(m.message.data for m in received)


def test_the_official_client_publishes_and_pulls(pubsub_emulator_host):
    assert publish_and_pull() == [b"order 0", b"order 1", b"order 2"]


def main() -> int:
    """`make image-test`: the image serves the official client, and keeps its promises — not root, ready on
    /readyz, healthy by its own HEALTHCHECK, a clean stop (exit 0) on SIGTERM, the data on /data kept."""
    if not shutil.which(ENGINE):
        print(f"skipped: no container engine ({ENGINE}) on this machine", file=sys.stderr)
        return 0
    image = json.loads(engine("image", "inspect", IMAGE))[0]
    healthcheck = image.get("Healthcheck") or image["Config"].get("Healthcheck")  # (podman's place, docker's)
    assert healthcheck, f"{IMAGE} has no HEALTHCHECK (podman keeps it only in --format docker)"
    with pigeon_container() as (container, grpc_at, http):
        os.environ["PUBSUB_EMULATOR_HOST"] = grpc_at
        got = publish_and_pull()
        assert got == [b"order 0", b"order 1", b"order 2"], got
        uid = engine("exec", container, "id", "-u")
        assert uid != "0", "the server runs as root"
        if ENGINE == "podman":  # (docker runs the HEALTHCHECK on its own schedule and has no command to run it now)
            engine("healthcheck", "run", container)
        started = time.monotonic()
        engine("stop", f"--time={STOP_S}", container, timeout=STOP_S + 30)
        took = time.monotonic() - started
        state = json.loads(engine("inspect", container))[0]["State"]
        assert state["ExitCode"] == 0 and took < STOP_S, \
            f"not a clean stop: exit {state['ExitCode']} after {took:.1f} s"
        engine("start", container)
        http = f"http://{mapped(container, 8086)}"  # (docker publishes a restarted container on new ports)
        deadline = time.monotonic() + READY_S
        while True:  # the same volume: the subscription is there again
            try:
                with urllib.request.urlopen(f"{http}/v1/projects/my-project/subscriptions/orders-worker",
                                            timeout=2) as r:
                    assert json.load(r)["topic"] == "projects/my-project/topics/orders"
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
    print(f"{IMAGE} ({ENGINE}): published and pulled {len(got)} messages with the official client at {grpc_at}, "
          f"uid {uid}, /readyz and the HEALTHCHECK answered, stopped cleanly on SIGTERM in {took:.1f} s (exit 0), "
          "the data kept across a restart")
    return 0


if __name__ == "__main__":
    sys.exit(main())
