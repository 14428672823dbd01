"""Pigeon's Python client: the official google-cloud-pubsub client for the standard surface, plus typed
helpers for the queue extensions (delayed activation, idempotent publish, take with a long lock,
reschedule, bury/kick, update, peek, delete by id).

    from pigeon.client import PigeonClient
    pigeon = PigeonClient("localhost:8085")
    pigeon.publish(topic, b"mail #1", delay=timedelta(minutes=5), idempotency_key="mail-1").result()
    for job in pigeon.take(subscription, max_messages=100, lock=timedelta(minutes=30)):
        ...
        pigeon.reschedule(subscription, [job.ack_id], delay=timedelta(days=1))  # periodic work
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import grpc
from google.cloud import pubsub_v1
from google.pubsub_v1 import types

from pigeon.api.proto import pigeon_queue_pb2 as q
from pigeon.client.access import ClientAuth, channel, pubsub_clients  # noqa: F401 — re-exported

ATTR_IDEMPOTENCY_KEY = "pigeon-idempotency-key"
ATTR_ACTIVATE_AT = "pigeon-activate-at"
ATTR_DELAY = "pigeon-delay"

_SERVICE = "/pigeon.v1.Queue/"


def _seconds(v: float | timedelta) -> float:
    return v.total_seconds() if isinstance(v, timedelta) else float(v)


def _epoch_ms(v: datetime | int | float) -> int:
    if isinstance(v, datetime):
        if v.tzinfo is None:
            v = v.replace(tzinfo=timezone.utc)
        return int(v.timestamp() * 1000)
    return int(v)


@dataclass(frozen=True)
class Taken:
    """A message locked by `take`: act on it with its ack_id."""

    ack_id: str
    message: types.PubsubMessage
    delivery_attempt: int

    @property
    def data(self) -> bytes:
        return self.message.data

    @property
    def attributes(self) -> dict[str, str]:
        return dict(self.message.attributes)


@dataclass(frozen=True)
class Peeked:
    message: types.PubsubMessage
    state: str  # active | locked | acked | buried | scheduled
    delivery_attempt: int
    activate_at: datetime | None


def secure_credentials(ca_pem: bytes | None = None, token: str | None = None,
                       tls: bool = True) -> grpc.ChannelCredentials:
    """Channel credentials for a secured Pigeon: TLS trusting `ca_pem` (None: the system's roots) and, with
    `token`, the bearer token on every call. `tls=False`: a token to a loopback server without TLS (gRPC sends
    call credentials in the clear over "local" TCP and nowhere else). (pigeon.client.access.ClientAuth also
    takes a client certificate, and reads files.)"""
    if tls:
        return ClientAuth(ca_pem=ca_pem, token=token).credentials()
    local = grpc.local_channel_credentials(grpc.LocalConnectionType.LOCAL_TCP)
    return grpc.composite_channel_credentials(local, grpc.access_token_call_credentials(token)) if token else local


class PigeonClient:
    def __init__(self, address: str | None = None, *, publisher: pubsub_v1.PublisherClient | None = None,
                 credentials: grpc.ChannelCredentials | None = None):
        """`credentials`: a secured server's (TLS, and a token as call credentials: `secure_credentials`)."""
        self.address = address or os.environ.get("PUBSUB_EMULATOR_HOST", "localhost:8085")
        options = [("grpc.max_receive_message_length", 32 << 20)]
        if publisher is None and credentials is not None:
            from google.pubsub_v1.services.publisher.transports import PublisherGrpcTransport

            publisher = pubsub_v1.PublisherClient(transport=PublisherGrpcTransport(
                channel=grpc.secure_channel(self.address, credentials)))
        if publisher is None:
            os.environ.setdefault("PUBSUB_EMULATOR_HOST", self.address)
            publisher = pubsub_v1.PublisherClient()
        self.publisher = publisher
        self._channel = grpc.secure_channel(self.address, credentials, options=options) if credentials is not None \
            else grpc.insecure_channel(self.address, options=options)

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: str, request, response_cls):
        rpc = self._channel.unary_unary(_SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                                        response_deserializer=response_cls.FromString)
        return rpc(request)

    # --- publishing --------------------------------------------------------------------------------
    def publish(self, topic: str, data: bytes, *, delay: float | timedelta | None = None,
                activate_at: datetime | int | None = None, idempotency_key: str | None = None,
                ordering_key: str = "", **attributes: str):
        """Publish through the official client; the extensions travel as reserved attributes, so any stock
        client can set them too. Returns the client's future (resolves to the message id)."""
        if delay is not None and activate_at is not None:
            raise ValueError("give delay or activate_at, not both")
        if delay is not None:
            attributes[ATTR_DELAY] = f"{_seconds(delay):g}s"
        if activate_at is not None:
            attributes[ATTR_ACTIVATE_AT] = str(_epoch_ms(activate_at))
        if idempotency_key is not None:
            attributes[ATTR_IDEMPOTENCY_KEY] = idempotency_key
        kwargs = {"ordering_key": ordering_key} if ordering_key else {}
        return self.publisher.publish(topic, data, **kwargs, **attributes)

    # --- the queue ---------------------------------------------------------------------------------
    def take(self, subscription: str, max_messages: int = 1000, lock: float | timedelta = 0) -> list[Taken]:
        """Lock up to `max_messages` ready messages for `lock` (0: the subscription's ack deadline)."""
        resp = self._call("Take", q.TakeRequest(subscription=subscription, max_messages=max_messages,
                                                lock_seconds=_seconds(lock)), q.TakeResponse)
        return [Taken(t.ack_id, types.PubsubMessage.deserialize(t.message), t.delivery_attempt)
                for t in resp.messages]

    def ack(self, subscription: str, ack_ids: list[str]) -> int:
        """Strict ack: fails (FAILED_PRECONDITION) unless every ack id is the current lock."""
        return self._call("Ack", q.AckRequest(subscription=subscription, ack_ids=ack_ids), q.AckResponse).acked

    def reschedule(self, subscription: str, ack_ids: list[str], *, at: datetime | int | None = None,
                   delay: float | timedelta | None = None) -> datetime:
        req = q.RescheduleRequest(subscription=subscription, ack_ids=ack_ids)
        if (at is None) == (delay is None):
            raise ValueError("give exactly one of at or delay")
        if at is not None:
            req.activate_at_ms = _epoch_ms(at)
        else:
            req.delay_seconds = _seconds(delay)
        ms = self._call("Reschedule", req, q.RescheduleResponse).activate_at_ms
        return datetime.fromtimestamp(ms / 1000, timezone.utc)

    def bury(self, subscription: str, ack_ids: list[str]) -> int:
        return self._call("Bury", q.BuryRequest(subscription=subscription, ack_ids=ack_ids), q.BuryResponse).buried

    def kick(self, subscription: str, max_messages: int = 0) -> int:
        return self._call("Kick", q.KickRequest(subscription=subscription, max_messages=max_messages),
                          q.KickResponse).kicked

    def update(self, subscription: str, ack_id: str, data: bytes, attributes: dict[str, str] | None = None) -> None:
        req = q.UpdateRequest(subscription=subscription, ack_id=ack_id, data=data,
                              attributes=attributes or {}, keep_attributes=attributes is None)
        self._call("Update", req, q.UpdateResponse)

    def peek(self, subscription: str, message_id: str) -> Peeked:
        r = self._call("Peek", q.PeekRequest(subscription=subscription, message_id=message_id), q.PeekResponse)
        at = datetime.fromtimestamp(r.activate_at_ms / 1000, timezone.utc) if r.activate_at_ms else None
        return Peeked(types.PubsubMessage.deserialize(r.message), r.state, r.delivery_attempt, at)

    def delete(self, subscription: str, message_ids: list[str]) -> int:
        return self._call("Delete", q.DeleteRequest(subscription=subscription, message_ids=message_ids),
                          q.DeleteResponse).deleted
