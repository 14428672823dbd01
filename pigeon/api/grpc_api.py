"""The Pub/Sub v1 gRPC surface. Owns the rule: translation only — wire messages in, engine calls, wire
messages out; errors leave through api.errors, the one boundary.

`google.pubsub_v1` ships message types but no servicers, so the services are generic handlers whose
(de)serializers are the raw protobuf classes. Publish takes and Pull/StreamingPull return raw bytes so
stored messages are spliced, not re-encoded."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging

import grpc
from pigeon.core.pubsub_types import types

from pigeon.broker import commands
from pigeon.core import limits, names, wire
from pigeon.node import hops
from pigeon.api import errors, merge, spread
from pigeon.api.access import FORWARDED, REGION
from pigeon.api.errors import abort, translate
from pigeon.core.errors import InvalidArgument, NotFound, Unavailable
from pigeon.node.engine import Engine

log = logging.getLogger("pigeon.api")

pb = {n: getattr(types, n).pb() for n in dir(types) if isinstance(getattr(types, n), type) and hasattr(getattr(types, n), "pb")}


PUBLISH = "/google.pubsub.v1.Publisher/Publish"
PULL = "/google.pubsub.v1.Subscriber/Pull"
ACKNOWLEDGE = "/google.pubsub.v1.Subscriber/Acknowledge"
MODIFY_ACK_DEADLINE = "/google.pubsub.v1.Subscriber/ModifyAckDeadline"
# admin calls that read or write a bundle's data (where a subscription starts, what a snapshot holds, where a
# seek goes) are answered by the bundle's owner, whose view of it is the current one
CREATE_SUBSCRIPTION = "/google.pubsub.v1.Subscriber/CreateSubscription"
CREATE_SNAPSHOT = "/google.pubsub.v1.Subscriber/CreateSnapshot"
SEEK = "/google.pubsub.v1.Subscriber/Seek"
DETACH_SUBSCRIPTION = "/google.pubsub.v1.Publisher/DetachSubscription"


def fresh(fn):
    """A cluster node answers NOT_FOUND only after catching up with the cluster's metadata: a resource made
    through another node a moment ago is found (read-your-writes across nodes)."""
    @functools.wraps(fn)
    async def handler(self, request, context):
        try:
            return await fn(self, request, context)
        except NotFound:
            if self.engine.meta_log is None:
                raise
            await self.engine.meta_log.catch_up()
            return await fn(self, request, context)

    return handler


class _Answer:
    """`answered` for engine.publish: what waits for this publisher's answer runs once the handler has it (or
    failed) — when it returns, gRPC hands the answer to the connection in the same step, ahead of any delivery a
    stream woken by it sends: a client that publishes and subscribes over one connection has a message's id before
    the message (as on Google's service, which clients' own tests rely on), at no wait for the network."""

    __slots__ = ("callbacks",)

    def __init__(self):
        self.callbacks: list = []

    def register(self, callback) -> None:
        self.callbacks.append(callback)

    def release(self) -> None:
        for callback in self.callbacks:
            callback()


class _Unannotated:
    @staticmethod
    def annotate(sub):
        return sub


class PubSubApi:
    def __init__(self, engine: Engine, router=None):
        self.engine = engine
        self.router = router  # a cluster node's (api.router): calls about other nodes' bundles go there
        self.exports = _Unannotated()  # the node's export supervisor (pigeon.node.exports): subscriptions' state

    # ---------------------------------------------------------------- Publisher
    @translate
    @fresh
    async def create_topic(self, req, context):
        return (await self.engine.create_topic(req)).SerializeToString()

    @translate
    @fresh
    async def update_topic(self, req, context):
        if not req.HasField("topic"):
            raise InvalidArgument("topic must be set.")
        return (await self.engine.update_topic(req.topic, req.update_mask)).SerializeToString()

    async def _publish_owner(self, cmd, context):
        """Where a publish whose topic was not first in its bytes goes (None: here)."""
        t = await self.router.spread_topic(cmd.topic, context)
        if t is None:
            return self.router.for_topic(cmd.topic, context)
        return self.router.storage_owner(t) or self.router.publish_owner(t, cmd.ordering_key)

    @translate
    @fresh
    async def publish(self, raw: bytes, context):
        if hops.ON:
            hops.mark("publish")
        cmd = None
        if self.router is not None:  # routed on its topic alone: the owner checks it (a megabyte parsed once)
            topic = wire.leading_string(raw, 1)
            if topic and (t := await self.router.spread_topic(topic, context)) is not None:
                if owner := self.router.storage_owner(t):  # (a region its storage policy allows: docs/regions.md)
                    return await self.router.unary(owner, PUBLISH, raw, context)
                cmd = commands.check_publish(raw)  # (its ordering key decides the shard)
                if cmd.idempotency_keys and not cmd.ordering_key:  # each message to its idempotency key's shard
                    return await spread.publish_by_key(self.router, t, cmd, context, self._publish_here)
                if owner := self.router.publish_owner(t, cmd.ordering_key):
                    return await self.router.unary(owner, PUBLISH, raw, context)
            elif topic and (owner := self.router.for_topic(topic, context)):
                return await self.router.unary(owner, PUBLISH, raw, context)
        if cmd is None:
            cmd = commands.check_publish(raw)
            if self.router is not None and cmd.topic != topic and (owner := await self._publish_owner(cmd, context)):
                return await self.router.unary(owner, PUBLISH, raw, context)  # its topic was not first in the bytes
        shard = spread.shard_asked(context) if self.router is not None else None
        answer = _Answer()
        try:
            ids = await self.engine.publish(cmd.topic, cmd.request, cmd.count, cmd.ordering_key,
                                            cmd.idempotency_keys, cmd.activations, shard=shard,
                                            answered=answer.register)
            if hops.ON:
                hops.mark("answered")
            return pb["PublishResponse"](message_ids=ids).SerializeToString()
        finally:
            answer.release()

    async def _publish_here(self, cmd, shard: int) -> list[str]:
        return await self.engine.publish(cmd.topic, cmd.request, cmd.count, cmd.ordering_key, cmd.idempotency_keys,
                                         cmd.activations, shard=shard)

    @translate
    @fresh
    async def get_topic(self, req, context):
        return self.engine.get_topic(req.topic).SerializeToString()

    @translate
    @fresh
    async def list_topics(self, req, context):
        project = names.project_of(req.project)
        page, token = self.engine.list_topics(project, req.page_size, req.page_token)
        reg = self.engine.state
        resp = pb["ListTopicsResponse"](topics=[reg.topics[n].config for n in page], next_page_token=token)
        return resp.SerializeToString()

    @translate
    @fresh
    async def list_topic_subscriptions(self, req, context):
        page, token = self.engine.list_topic_subscriptions(req.topic, req.page_size, req.page_token)
        return pb["ListTopicSubscriptionsResponse"](subscriptions=page, next_page_token=token).SerializeToString()

    @translate
    @fresh
    async def list_topic_snapshots(self, req, context):
        page, token = self.engine.list_topic_snapshots(req.topic, req.page_size, req.page_token)
        return pb["ListTopicSnapshotsResponse"](snapshots=page, next_page_token=token).SerializeToString()

    @translate
    @fresh
    async def delete_topic(self, req, context):
        await self.engine.delete_topic(req.topic)
        return b""

    @translate
    @fresh
    async def detach_subscription(self, req, context):
        if self.router is not None and (t := await self.router.spread_subscription(req.subscription, context)):
            await self.engine.detach_subscription(req.subscription)  # marked detached here first, then each
            await spread.everywhere(self.router, t, DETACH_SUBSCRIPTION, req, context,  # owner drops its
                                    lambda: _now(b""))  # shards' backlog
            return b""
        if self.router is not None and (owner := await self.router.for_subscription(req.subscription, context)):
            return await self.router.unary(owner, DETACH_SUBSCRIPTION, req.SerializeToString(), context)
        await self.engine.detach_subscription(req.subscription)
        return b""

    # ---------------------------------------------------------------- Subscriber
    @translate
    @fresh
    async def create_subscription(self, req, context):
        start = None
        if self.router is not None and req.topic:
            if (t := await self.router.spread_topic(req.topic, context)) is not None:  # made here, from each shard's end
                start = await spread.subscription_start(self.router, t, context, lambda: _now(t.backlog_end()))
            elif owner := self.router.for_topic(req.topic, context):
                return await self.router.unary(owner, CREATE_SUBSCRIPTION, req.SerializeToString(), context)
        return self.exports.annotate(await self.engine.create_subscription(req, start)).SerializeToString()

    @translate
    @fresh
    async def get_subscription(self, req, context):
        return self.exports.annotate(self.engine.get_subscription(req.subscription)).SerializeToString()

    @translate
    @fresh
    async def update_subscription(self, req, context):
        if not req.HasField("subscription"):
            raise InvalidArgument("subscription must be set.")
        return self.exports.annotate(await self.engine.update_subscription(req.subscription,
                                                                           req.update_mask)).SerializeToString()

    @translate
    @fresh
    async def list_subscriptions(self, req, context):
        project = names.project_of(req.project)
        page, token = self.engine.list_subscriptions(project, req.page_size, req.page_token)
        subs = [self.exports.annotate(self.engine.get_subscription(n)) for n in page]
        return pb["ListSubscriptionsResponse"](subscriptions=subs, next_page_token=token).SerializeToString()

    @translate
    @fresh
    async def delete_subscription(self, req, context):
        await self.engine.delete_subscription(req.subscription)
        return b""

    @translate
    @fresh
    async def modify_ack_deadline(self, req, context):
        if self.router is not None and (t := await self.router.spread_subscription(req.subscription, context)):
            await spread.split_acks(self.router, t, req, list(req.ack_ids), MODIFY_ACK_DEADLINE, context,
                                    lambda ids: self.engine.delivery.modify_ack_deadline(
                                        req.subscription, ids, req.ack_deadline_seconds))
            return b""
        if self.router is not None and (owner := await self.router.for_subscription(req.subscription, context)):
            return await self.router.unary(owner, MODIFY_ACK_DEADLINE, req.SerializeToString(), context)
        await self.engine.delivery.modify_ack_deadline(req.subscription, list(req.ack_ids), req.ack_deadline_seconds)
        return b""

    @translate
    @fresh
    async def acknowledge(self, req, context):
        if self.router is not None and (t := await self.router.spread_subscription(req.subscription, context)):
            await spread.split_acks(self.router, t, req, list(req.ack_ids), ACKNOWLEDGE, context,
                                    lambda ids: self.engine.delivery.acknowledge(req.subscription, ids))
            return b""
        if self.router is not None and (owner := await self.router.for_subscription(req.subscription, context)):
            return await self.router.unary(owner, ACKNOWLEDGE, req.SerializeToString(), context)
        await self.engine.delivery.acknowledge(req.subscription, list(req.ack_ids))
        return b""

    @translate
    @fresh
    async def pull(self, req, context):
        if self.router is not None and (t := await self.router.spread_subscription(req.subscription, context)):
            self.router.check_in_transit(t)

            async def here(max_messages: int, now: bool) -> bytes:
                return b"".join(await self.engine.delivery.pull(req.subscription, max_messages, now,
                                                                context.time_remaining()))
            return await spread.pull(self.router, t, req, context, here)
        if self.router is not None and (owner := await self.router.for_subscription(req.subscription, context)):
            return await self.router.unary(owner, PULL, req.SerializeToString(), context, waits=True)
        rms = await self.engine.delivery.pull(req.subscription, req.max_messages, req.return_immediately,
                                     context.time_remaining())
        return b"".join(rms)  # each is already an encoded received_messages entry

    async def streaming_pull(self, request_iterator, context):
        engine = self.engine
        stream = None
        reader = None
        try:
            try:
                first = await request_iterator.__anext__()
            except StopAsyncIteration:
                return
            if type(first) is errors.Unparsable:
                raise first.refused()
            if not first.subscription:
                raise InvalidArgument("The first StreamingPullRequest must set subscription.")
            client = not any(k in (FORWARDED, REGION) for k, _ in context.invocation_metadata() or ())
            if client:
                # a client sets flow control in its first request only (Pub/Sub's rule); a merge of a spread
                # topic's shards (api.spread) steers each owner's (or region's) share of it by later ones
                request_iterator = _limits_set_once(request_iterator)
            if self.router is not None and (t := await self.router.spread_subscription(first.subscription, context)):
                self.router.check_in_transit(t)
                async for resp in merge.streaming_pull(self.router, t, first, request_iterator, context,
                                                       self.own_share):
                    yield resp
                return
            if self.router is not None and (owner := await self.router.for_stream(first.subscription, context)):
                async for resp in merge.forwarded(self.router, owner, first, request_iterator, context,
                                                  self.own_share):
                    yield resp
                return
            stream = self._open_stream(first)
            handoff = merge.Handoff()
            reader = asyncio.create_task(self._read_requests(stream, request_iterator, handoff))
            try:
                async with contextlib.aclosing(self._deliveries(stream)) as deliveries:
                    async for resp in deliveries:
                        yield resp
                return
            except Unavailable:
                if not client or not self._moved_away(first.subscription):
                    raise
            # the subscription's bundle, or a shard of its topic, is another node's now: the client's stream goes
            # on through its owners (its messages leased here stay leased there, till their deadlines)
            engine.delivery.close_stream(stream)
            stream = None
            async for resp in merge.follow(self.router, first, handoff.requests(), context, self.own_share):
                yield resp
        except Exception as e:  # noqa: BLE001 — the boundary (api.errors): a PigeonError or a bug
            await abort(context, e)
        finally:
            if reader is not None:
                reader.cancel()
            if stream is not None:
                engine.delivery.close_stream(stream)

    async def own_share(self, first, requests):
        """This node's share of a StreamingPull that api.merge serves from several owners' streams: the stream a
        forwarded StreamingPull would get here, without the round trip through this node's own port (each
        message and ack would pass gRPC twice more on this node). `requests`: the merge's later requests (acks,
        deadline changes, its share of the client's flow control). Ends as a forwarded stream ends — with
        Unavailable once the subscription's bundle, or a shard of its topic, is another node's (the merge
        replaces it), with what ended it otherwise."""
        engine, reader, stream = self.engine, None, None
        try:
            s = engine.state.subs.get(first.subscription)
            if s is not None and (s.topic is None or not s.topic.spread) \
                    and not engine.owns(engine.state.log_of_sub(first.subscription, engine.config.bundles)):
                raise Unavailable("The topic's bundle is moving between nodes; retry.")  # (as the router says)
            stream = self._open_stream(first)
            reader = asyncio.create_task(self._read_requests(stream, requests, merge.Handoff()))
            async with contextlib.aclosing(self._deliveries(stream)) as deliveries:
                async for resp in deliveries:
                    yield resp
        finally:
            if reader is not None:
                reader.cancel()
            if stream is not None:
                engine.delivery.close_stream(stream)

    def _open_stream(self, first):
        """A stream served here for `first`, the StreamingPull's first request (its acks applied)."""
        stream = self.engine.delivery.open_stream(
            first.subscription,
            first.client_id,
            first.stream_ack_deadline_seconds,
            first.max_outstanding_messages or limits.stream_outstanding_messages_default,
            first.max_outstanding_bytes,
        )
        try:
            self._stream_requests(stream, first)
        except BaseException:
            self.engine.delivery.close_stream(stream)
            raise
        return stream

    async def _deliveries(self, stream):
        """A stream's responses as it gets them, each held against the budget of responses on their way
        (admission) until taken; ends once its client half-closed, raises what ended it otherwise."""
        engine = self.engine
        cfg = stream.sub.config
        props = wire.length_delimited(
            4,
            (b"\x08\x01" if cfg.enable_exactly_once_delivery else b"")
            + (b"\x10\x01" if cfg.enable_message_ordering else b""),
        )
        admission, clock = engine.admission, engine.clock
        while True:
            rms = await engine.delivery.stream_next(stream)
            if rms is None:
                return
            out, stream.outbox = stream.outbox, []
            if rms:
                out.extend(_responses(rms, props))
            for resp in out:  # each is held against the budget until the client has taken it
                n = len(resp)
                admission.sending(n)
                stream.sending_since, stream.sending_bytes = clock.now(), n
                if hops.ON:
                    hops.mark("sending")
                try:
                    yield resp
                finally:
                    admission.sent(n)
                    stream.sending_since = None

    def _stream_requests(self, stream, req) -> None:
        eod = stream.sub.config.enable_exactly_once_delivery
        if req.ack_ids:
            ack_ids = list(req.ack_ids)
            durable, failures = self.engine.delivery.stream_acks(stream, ack_ids)
            if eod:  # confirm once the acks are durable
                ok = [a for a in ack_ids if a not in failures]
                confirmation = pb["StreamingPullResponse"](
                    acknowledge_confirmation={"ack_ids": ok, "invalid_ack_ids": list(failures)})
                durable.add_done_callback(lambda _f: self._post(stream, confirmation))
        if req.modify_deadline_ack_ids or req.modify_deadline_seconds:
            ids = list(req.modify_deadline_ack_ids)
            failures = self.engine.delivery.modify_deadlines(stream.sub, ids, list(req.modify_deadline_seconds))
            if eod:
                self._post(stream, pb["StreamingPullResponse"](modify_ack_deadline_confirmation={
                    "ack_ids": [a for a in ids if a not in failures], "invalid_ack_ids": list(failures)}))

    def _post(self, stream, response) -> None:
        stream.outbox.append(response.SerializeToString())
        stream.wake()

    async def _read_requests(self, stream, request_iterator, handoff) -> None:
        """The client's requests for the stream served here — until it broke (its subscription moved away: what
        comes then goes to `handoff`, for the stream's owners from then on)."""
        try:
            async for req in request_iterator:
                if stream.error is not None or handoff.q is not None:
                    handoff.put(req)
                    continue
                if type(req) is errors.Unparsable:
                    raise req.refused()
                if req.max_outstanding_messages or req.max_outstanding_bytes:  # (a merge's steering: a client's
                    stream.resize(req.max_outstanding_messages, req.max_outstanding_bytes)  # is refused above)
                try:
                    self._stream_requests(stream, req)
                except Unavailable as e:  # (its subscription moved away: the stream ends here, or follows it)
                    stream.error = e
                    handoff.put(req)
                    stream.wake()
        except (asyncio.CancelledError, grpc.RpcError):
            return
        except Exception as e:  # noqa: BLE001 — a PigeonError or a bug: the stream ends with it (api.errors)
            stream.error = e
        else:
            stream.ended = True
            handoff.put(None)
        stream.wake()

    def _moved_away(self, name: str) -> bool:
        """Whether a stream served here broke because its subscription's bundle, or a shard of its topic, is
        another node's now — or on its way there (a hand-over pending: its deliveries refused here until the
        shard is homed, a fraction of a second; the stream that follows waits it out). (Only a client's stream
        follows the move: one forwarded here ends, and the node that forwarded it follows.)"""
        engine = self.engine
        if self.router is None or engine.closing:
            return False
        s = engine.state.subs.get(name)
        if s is None:
            return False
        if s.topic is not None and (s.topic.spread or s.topic.away):
            return True
        return not engine.owns(engine.state.log_of_sub(name, engine.config.bundles))

    @translate
    @fresh
    async def modify_push_config(self, req, context):
        s = self.engine.state.sub(req.subscription)
        sub = pb["Subscription"](name=s.name, push_config=req.push_config)
        mask = pb["UpdateSubscriptionRequest"](update_mask={"paths": ["push_config"]}).update_mask
        await self.engine.update_subscription(sub, mask)
        return b""

    @translate
    @fresh
    async def get_snapshot(self, req, context):
        return self.engine.get_snapshot(req.snapshot).SerializeToString()

    @translate
    @fresh
    async def list_snapshots(self, req, context):
        project = names.project_of(req.project)
        page, token = self.engine.list_snapshots(project, req.page_size, req.page_token)
        snaps = [self.engine.get_snapshot(n) for n in page]
        return pb["ListSnapshotsResponse"](snapshots=snaps, next_page_token=token).SerializeToString()

    @translate
    @fresh
    async def create_snapshot(self, req, context):
        state = None
        if self.router is not None and (t := await self.router.spread_subscription(req.subscription, context)):
            state = await spread.ack_state(self.router, t, req.subscription, context)  # each shard's, at its owner
        elif self.router is not None and (owner := await self.router.for_subscription(req.subscription, context)):
            return await self.router.unary(owner, CREATE_SNAPSHOT, req.SerializeToString(), context)
        snap = await self.engine.create_snapshot(req.name, req.subscription, dict(req.labels), state)
        return snap.SerializeToString()

    @translate
    @fresh
    async def update_snapshot(self, req, context):
        return (await self.engine.update_snapshot(req.snapshot, req.update_mask)).SerializeToString()

    @translate
    @fresh
    async def delete_snapshot(self, req, context):
        await self.engine.delete_snapshot(req.snapshot)
        return b""

    @translate
    @fresh
    async def seek(self, req, context):
        if self.router is not None and (t := await self.router.spread_subscription(req.subscription, context)):
            await spread.everywhere(self.router, t, SEEK, req, context, lambda: self._seek_here(req))
            return b""
        if self.router is not None and (owner := await self.router.for_subscription(req.subscription, context)):
            return await self.router.unary(owner, SEEK, req.SerializeToString(), context)
        return await self._seek_here(req)

    async def _seek_here(self, req) -> bytes:
        """Seek this node's share: every shard, or those of a spread topic it owns."""
        which = req.WhichOneof("target")
        if which == "time":
            await self.engine.seek(req.subscription, req.time.ToMilliseconds(), None)
        elif which == "snapshot":
            await self.engine.seek(req.subscription, None, req.snapshot)
        else:
            raise InvalidArgument("Seek needs either time or snapshot.")
        return b""

    # ---------------------------------------------------------------- wiring
    def handlers(self) -> list[grpc.GenericRpcHandler]:
        def unary(fn, request_type):
            return errors.unary(fn, pb[request_type] if request_type else None)

        publisher = {
            "CreateTopic": unary(self.create_topic, "Topic"),
            "UpdateTopic": unary(self.update_topic, "UpdateTopicRequest"),
            "Publish": unary(self.publish, None),
            "GetTopic": unary(self.get_topic, "GetTopicRequest"),
            "ListTopics": unary(self.list_topics, "ListTopicsRequest"),
            "ListTopicSubscriptions": unary(self.list_topic_subscriptions, "ListTopicSubscriptionsRequest"),
            "ListTopicSnapshots": unary(self.list_topic_snapshots, "ListTopicSnapshotsRequest"),
            "DeleteTopic": unary(self.delete_topic, "DeleteTopicRequest"),
            "DetachSubscription": unary(self.detach_subscription, "DetachSubscriptionRequest"),
        }
        subscriber = {
            "CreateSubscription": unary(self.create_subscription, "Subscription"),
            "GetSubscription": unary(self.get_subscription, "GetSubscriptionRequest"),
            "UpdateSubscription": unary(self.update_subscription, "UpdateSubscriptionRequest"),
            "ListSubscriptions": unary(self.list_subscriptions, "ListSubscriptionsRequest"),
            "DeleteSubscription": unary(self.delete_subscription, "DeleteSubscriptionRequest"),
            "ModifyAckDeadline": unary(self.modify_ack_deadline, "ModifyAckDeadlineRequest"),
            "Acknowledge": unary(self.acknowledge, "AcknowledgeRequest"),
            "Pull": unary(self.pull, "PullRequest"),
            "StreamingPull": grpc.stream_stream_rpc_method_handler(
                self.streaming_pull,
                request_deserializer=errors.parser(pb["StreamingPullRequest"]),
                response_serializer=None,
            ),
            "ModifyPushConfig": unary(self.modify_push_config, "ModifyPushConfigRequest"),
            "GetSnapshot": unary(self.get_snapshot, "GetSnapshotRequest"),
            "ListSnapshots": unary(self.list_snapshots, "ListSnapshotsRequest"),
            "CreateSnapshot": unary(self.create_snapshot, "CreateSnapshotRequest"),
            "UpdateSnapshot": unary(self.update_snapshot, "UpdateSnapshotRequest"),
            "DeleteSnapshot": unary(self.delete_snapshot, "DeleteSnapshotRequest"),
            "Seek": unary(self.seek, "SeekRequest"),
        }
        return [
            grpc.method_handlers_generic_handler("google.pubsub.v1.Publisher", publisher),
            grpc.method_handlers_generic_handler("google.pubsub.v1.Subscriber", subscriber),
        ]


def _responses(rms: list[bytes], props: bytes):
    """StreamingPullResponse bytes, each under the client's 4 MiB receive limit."""
    parts: list[bytes] = [props]
    size = len(props)
    for item in rms:
        if size + len(item) > limits.response_bytes_max and len(parts) > 1:
            yield b"".join(parts)
            parts, size = [props], len(props)
        parts.append(item)
        size += len(item)
    yield b"".join(parts)


async def _now(value):
    return value


async def _limits_set_once(requests):
    """A client's StreamingPull requests after its first, refused (INVALID_ARGUMENT, ending the stream) once one
    sets flow control, as Pub/Sub refuses it."""
    async for req in requests:
        if type(req) is not errors.Unparsable and (req.max_outstanding_messages or req.max_outstanding_bytes):
            raise InvalidArgument("max_outstanding_messages and max_outstanding_bytes can only be set on the "
                                  "initial StreamingPullRequest.")
        yield req
