"""Command-line verbs for a running server: topics, subscriptions, publish/pull and the queue extensions.
They talk to the server through the official client and pigeon.client, like any other program."""

from __future__ import annotations

import json
from typing import Optional

import typer

from pigeon.cli.credentials import client_auth
from pigeon.cli.errors import check_reachable
from pigeon.cli.output import FORMAT, RECEIVED, Format, console, show

DEFAULT_ADDRESS = "localhost:8085"
ADDRESS = typer.Option(None, "--address", "-a", envvar="PUBSUB_EMULATOR_HOST", help="server host:port")
PROJECT = typer.Option("default", "--project", "-p", help="project of the names given without one")


def _clients(address: str | None, **publisher_options):
    """The official clients, secured as the global options say (`pigeon --tls-ca … --token-file … VERB`)."""
    from pigeon.client.access import pubsub_clients

    address = address or DEFAULT_ADDRESS
    auth = client_auth()
    check_reachable(address, auth)
    return pubsub_clients(address, auth, **publisher_options)


def _full(name: str, project: str, kind: str) -> str:
    return name if name.startswith("projects/") else f"projects/{project}/{kind}/{name}"


topics = typer.Typer(help="Create, list and delete topics.", no_args_is_help=True)
subscriptions = typer.Typer(help="Create, list and delete subscriptions.", no_args_is_help=True)
queue = typer.Typer(help="Queue extensions: take, ack, reschedule, bury, kick, peek, delete.", no_args_is_help=True)


@topics.command("create")
def topics_create(name: str, address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Create a topic."""
    pub, _ = _clients(address)
    console.print(pub.create_topic(name=_full(name, project, "topics")).name)


@topics.command("list")
def topics_list(address: Optional[str] = ADDRESS, project: str = PROJECT, fmt: Format = FORMAT):
    """List the project's topics."""
    pub, _ = _clients(address)
    show(fmt, "topics", list(pub.list_topics(project=f"projects/{project}")), [
        ("topic", lambda t: t.name), ("labels", lambda t: ", ".join(f"{k}={v}" for k, v in sorted(t.labels.items())))])


@topics.command("delete")
def topics_delete(name: str, address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Delete a topic (its subscriptions stay, on _deleted-topic_)."""
    pub, _ = _clients(address)
    pub.delete_topic(topic=_full(name, project, "topics"))


@subscriptions.command("create")
def subscriptions_create(
    name: str,
    topic: str = typer.Option(..., "--topic", "-t"),
    ack_deadline: int = typer.Option(10, help="seconds"),
    ordering: bool = typer.Option(False, help="enable message ordering"),
    filter: str = typer.Option("", help="Pub/Sub filter expression"),
    address: Optional[str] = ADDRESS,
    project: str = PROJECT,
):
    """Create a subscription to a topic."""
    _, sub = _clients(address)
    s = sub.create_subscription(request={
        "name": _full(name, project, "subscriptions"), "topic": _full(topic, project, "topics"),
        "ack_deadline_seconds": ack_deadline, "enable_message_ordering": ordering, "filter": filter})
    console.print(s.name)


@subscriptions.command("list")
def subscriptions_list(address: Optional[str] = ADDRESS, project: str = PROJECT, fmt: Format = FORMAT):
    """List the project's subscriptions."""
    _, sub = _clients(address)
    show(fmt, "subscriptions", list(sub.list_subscriptions(project=f"projects/{project}")), [
        ("subscription", lambda s: s.name), ("topic", lambda s: s.topic),
        ("ack deadline", lambda s: s.ack_deadline_seconds)])


@subscriptions.command("delete")
def subscriptions_delete(name: str, address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Delete a subscription and its backlog."""
    _, sub = _clients(address)
    sub.delete_subscription(subscription=_full(name, project, "subscriptions"))


def publish(
    topic: str,
    data: str,
    attribute: list[str] = typer.Option([], "--attribute", "-A", help="key=value, repeatable"),
    delay: Optional[str] = typer.Option(None, help="activate after this delay: 90s, 15m, 2h, 1d"),
    activate_at: Optional[str] = typer.Option(None, help="activate at this RFC 3339 time or epoch ms"),
    idempotency_key: Optional[str] = typer.Option(None, help="publish once per key within the window"),
    ordering_key: str = typer.Option("", help="ordering key"),
    address: Optional[str] = ADDRESS,
    project: str = PROJECT,
):
    """Publish one message; prints its id."""
    bad = [a for a in attribute if "=" not in a]
    if bad:
        raise typer.BadParameter(f"{bad[0]!r} is not key=value", param_hint="--attribute")
    pub, _ = _clients(address, **({"enable_message_ordering": True} if ordering_key else {}))
    attrs = dict(a.split("=", 1) for a in attribute)
    if delay:
        attrs["pigeon-delay"] = delay
    if activate_at:
        attrs["pigeon-activate-at"] = activate_at
    if idempotency_key:
        attrs["pigeon-idempotency-key"] = idempotency_key
    kwargs = {"ordering_key": ordering_key} if ordering_key else {}
    console.print(pub.publish(_full(topic, project, "topics"), data.encode(), **kwargs, **attrs).result(timeout=30))


def pull(
    subscription: str,
    max_messages: int = typer.Option(10, "--max", "-n"),
    ack: bool = typer.Option(False, help="acknowledge what was pulled"),
    address: Optional[str] = ADDRESS,
    project: str = PROJECT,
    fmt: Format = FORMAT,
):
    """Pull messages (waiting up to 10 s for some) and print them."""
    _, sub = _clients(address)
    name = _full(subscription, project, "subscriptions")
    resp = sub.pull(subscription=name, max_messages=max_messages, timeout=10)
    show(fmt, "receivedMessages", list(resp.received_messages), RECEIVED)
    if ack and resp.received_messages:
        sub.acknowledge(subscription=name, ack_ids=[m.ack_id for m in resp.received_messages])


def _pigeon(address):
    from pigeon.client import PigeonClient

    address = address or DEFAULT_ADDRESS
    auth = client_auth()
    check_reachable(address, auth)
    return PigeonClient(address, credentials=auth.credentials() if auth is not None else None)


@queue.command("take")
def queue_take(subscription: str, max_messages: int = typer.Option(10, "--max", "-n"),
               lock: float = typer.Option(0, help="lock seconds (0: the ack deadline)"),
               address: Optional[str] = ADDRESS, project: str = PROJECT, fmt: Format = FORMAT):
    """Lock up to N ready messages (scheduled ones in activation order) and print them."""
    from google.pubsub_v1 import types

    taken = _pigeon(address).take(_full(subscription, project, "subscriptions"), max_messages, lock)
    show(fmt, "receivedMessages", [types.ReceivedMessage(ack_id=t.ack_id, message=t.message,
                                                         delivery_attempt=t.delivery_attempt) for t in taken], RECEIVED)


@queue.command("ack")
def queue_ack(subscription: str, ack_ids: list[str], address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Acknowledge locked messages (fails unless every ack id is the current lock)."""
    console.print(_pigeon(address).ack(_full(subscription, project, "subscriptions"), ack_ids))


@queue.command("reschedule")
def queue_reschedule(subscription: str, ack_ids: list[str], delay: float = typer.Option(..., help="seconds"),
                     address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Release locked messages to activate again after DELAY seconds (same message id)."""
    at = _pigeon(address).reschedule(_full(subscription, project, "subscriptions"), ack_ids, delay=delay)
    console.print(at.isoformat())


@queue.command("bury")
def queue_bury(subscription: str, ack_ids: list[str], address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Park locked messages until kicked."""
    console.print(_pigeon(address).bury(_full(subscription, project, "subscriptions"), ack_ids))


@queue.command("kick")
def queue_kick(subscription: str, max_messages: int = typer.Option(0, "--max", "-n", help="0: all"),
               address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Return buried messages to the queue."""
    console.print(_pigeon(address).kick(_full(subscription, project, "subscriptions"), max_messages))


@queue.command("peek")
def queue_peek(subscription: str, message_id: str, address: Optional[str] = ADDRESS, project: str = PROJECT):
    """Show a message by id without taking it."""
    p = _pigeon(address).peek(_full(subscription, project, "subscriptions"), message_id)
    print(json.dumps({"state": p.state, "delivery_attempt": p.delivery_attempt,
                      "activate_at": p.activate_at.isoformat() if p.activate_at else None,
                      "data": p.message.data.decode(errors="replace"), "attributes": dict(p.message.attributes)}))


@queue.command("delete")
def queue_delete(subscription: str, message_ids: list[str], address: Optional[str] = ADDRESS,
                 project: str = PROJECT):
    """Delete messages by id without taking them."""
    console.print(_pigeon(address).delete(_full(subscription, project, "subscriptions"), message_ids))


def register(app: typer.Typer) -> None:
    app.add_typer(topics, name="topics")
    app.add_typer(subscriptions, name="subscriptions")
    app.add_typer(queue, name="queue")
    app.command("publish")(publish)
    app.command("pull")(pull)
