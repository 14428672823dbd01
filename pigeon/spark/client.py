"""A small synchronous client for what the Spark connector needs from a Pigeon node: the pigeon.v1.Ranges
extension (offsets, range reads, cursors) and Publish. Owns the rule: calls that are safe to repeat are
retried on UNAVAILABLE with backoff; nothing else is retried.

Used on the driver and on executors alike, so it holds only an endpoint and, for a secured node, its access
(pigeon.client.access: the CA, token and client certificate as bytes), and opens its channel lazily (a pickled
client carries no channel)."""

from __future__ import annotations

import time

import grpc
from google.pubsub_v1 import types

from pigeon.api.proto import pigeon_ranges_pb2 as pb
from pigeon.client.access import ClientAuth, channel

_PublishRequest = types.PublishRequest.pb()
_PublishResponse = types.PublishResponse.pb()
_Subscription = types.Subscription.pb()
_ListSubscriptionsRequest = types.ListSubscriptionsRequest.pb()
_ListSubscriptionsResponse = types.ListSubscriptionsResponse.pb()

receive_bytes_max = 64 * 1024 * 1024
retry_attempts_max = 8
retry_backoff_s_max = 2.0
call_timeout_s = 60.0

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}


class PigeonClient:
    def __init__(self, endpoint: str, auth: ClientAuth | None = None):
        self.endpoint, self.auth = endpoint, auth
        self._channel: grpc.Channel | None = None
        self._calls: dict = {}

    def __getstate__(self):
        return {"endpoint": self.endpoint, "auth": self.auth}

    def __setstate__(self, state):
        self.__init__(state["endpoint"], state.get("auth"))

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel, self._calls = None, {}

    def _call(self, path: str, response_cls):
        c = self._calls.get(path)
        if c is None:
            if self._channel is None:
                self._channel = channel(self.endpoint, self.auth,
                                        options=[("grpc.max_receive_message_length", receive_bytes_max),
                                                 ("grpc.max_send_message_length", receive_bytes_max)])
            c = self._calls[path] = self._channel.unary_unary(
                path, request_serializer=lambda m: m.SerializeToString(), response_deserializer=response_cls.FromString
            )
        return c

    def _retry(self, path: str, response_cls, request, retry: bool = True):
        call = self._call(path, response_cls)
        delay = 0.05
        for attempt in range(retry_attempts_max):
            try:
                return call(request, timeout=call_timeout_s)
            except grpc.RpcError as e:
                if not retry or e.code() not in _RETRYABLE or attempt == retry_attempts_max - 1:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, retry_backoff_s_max)

    # --- pigeon.v1.Ranges ----------------------------------------------------------------------
    def latest_offsets(self, topic: str, at_time_ms: int | None = None) -> pb.LatestOffsetsResponse:
        req = pb.LatestOffsetsRequest(topic=topic)
        if at_time_ms is not None:
            req.at_time_ms = at_time_ms
        return self._retry("/pigeon.v1.Ranges/LatestOffsets", pb.LatestOffsetsResponse, req)

    def read_range_future(self, topic: str, shard: int, start: int, end: int, *, max_messages: int = 0,
                          max_bytes: int = 0, allow_data_loss: bool = False, topic_uid: int = 0):
        """Start one ReadRange call; `.result()` gives the ReadRangeResponse (lets a reader fetch the next
        range while it converts the last one)."""
        req = pb.ReadRangeRequest(topic=topic, shard=shard, start_offset=start, end_offset=end,
                                  max_messages=max_messages, max_bytes=max_bytes, allow_data_loss=allow_data_loss,
                                  topic_uid=topic_uid)
        return self._call("/pigeon.v1.Ranges/ReadRange", pb.ReadRangeResponse).future(req, timeout=call_timeout_s)

    def read_range(self, topic: str, shard: int, start: int, end: int, **kw) -> pb.ReadRangeResponse:
        delay = 0.05
        for attempt in range(retry_attempts_max):
            try:
                return self.read_range_future(topic, shard, start, end, **kw).result()
            except grpc.RpcError as e:
                if e.code() not in _RETRYABLE or attempt == retry_attempts_max - 1:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, retry_backoff_s_max)

    def create_cursor(self, name: str, topic: str, offsets: list[int] | None = None) -> pb.Cursor:
        req = pb.CreateCursorRequest(name=name, topic=topic, offsets=offsets or [])
        return self._retry("/pigeon.v1.Ranges/CreateCursor", pb.Cursor, req)

    def get_cursor(self, name: str) -> pb.Cursor:
        return self._retry("/pigeon.v1.Ranges/GetCursor", pb.Cursor, pb.GetCursorRequest(name=name))

    def commit_cursor(self, name: str, offsets: list[int]) -> pb.Cursor:
        req = pb.CommitCursorRequest(name=name, offsets=offsets)
        return self._retry("/pigeon.v1.Ranges/CommitCursor", pb.Cursor, req)

    # --- google.pubsub.v1 ----------------------------------------------------------------------
    def publish(self, request) -> list[str]:
        """Publish one PublishRequest. Retried: safe when every message carries an idempotency key."""
        return list(self._retry("/google.pubsub.v1.Publisher/Publish", _PublishResponse, request).message_ids)

    def get_subscription(self, name: str):
        req = types.GetSubscriptionRequest.pb()(subscription=name)
        return self._retry("/google.pubsub.v1.Subscriber/GetSubscription", _Subscription, req)

    def list_subscriptions(self, project: str) -> list:
        out, token = [], ""
        while True:
            req = _ListSubscriptionsRequest(project=f"projects/{project}", page_size=1000, page_token=token)
            resp = self._retry("/google.pubsub.v1.Subscriber/ListSubscriptions", _ListSubscriptionsResponse, req)
            out.extend(resp.subscriptions)
            token = resp.next_page_token
            if not token:
                return out
