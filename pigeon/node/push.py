"""Push delivery: each message of a push subscription is POSTed to its endpoint. Owns the rules:
- one worker per push subscription (push_endpoint set, not detached, endpoint allowed); a subscription
  switched back to pull stops taking messages, lets its requests in flight finish, and its worker ends;
- one message per request, timed out after the subscription's ack deadline; an answer of 102, 200, 201,
  202 or 204 acks the message (through the engine's ack path, so it is logged), anything else — another
  status, a connection error, a timeout — nacks it so the retry policy's backoff applies;
- an answer counts only while the worker still holds the message's lease: a lease that ended meanwhile
  (expired, seek, detach) was already settled by the subscription;
- flow control per subscription (AIMD, like TCP): at most `window` requests in flight; the window starts
  at push_window_start, grows by one per success up to push_window_max and halves per failure;
  consecutive failures also pause new requests, push_backoff_s_min doubling up to push_backoff_s_max;
- ordered subscriptions: one outstanding message per ordering key (take(per_key_max=1));
- the request formats (wrapped JSON; raw data with optional metadata headers) and the OIDC token (signed by
  pigeon.node.push_tokens with `push_signing_key`, or the key kept in the data directory; its public key is
  published on the HTTP port while the manager runs);
Formats, window and endpoint check are plain functions and classes; PushManager and its workers
perform them."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re

from pigeon.core.pubsub_types import types

from pigeon.core import ackid, limits
from pigeon.core.errors import PigeonError, Unavailable
from pigeon.node import push_tokens
from pigeon.node.transforms import Failure

log = logging.getLogger("pigeon.push")
_PubsubMessage = types.PubsubMessage.pb()

# limits live in pigeon.core.limits; bound here so tests can narrow them for one module
push_window_start = limits.push_window_start
push_window_max = limits.push_window_max
push_backoff_s_min = limits.push_backoff_s_min
push_backoff_s_max = limits.push_backoff_s_max
push_wait_s_max = limits.push_wait_s_max
push_connections_max = limits.push_connections_max
push_response_bytes_max = limits.push_response_bytes_max

ACK_STATUSES = frozenset({102, 200, 201, 202, 204})
_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")  # an HTTP header name (RFC 9110 token)
# headers an attribute may not set: they frame or route the request, or carry our own credentials
_RESERVED_HEADERS = frozenset({
    "authorization", "connection", "content-length", "content-type", "expect", "host", "keep-alive",
    "proxy-authorization", "te", "trailer", "transfer-encoding", "upgrade",
})

# --- endpoint allow-list ---------------------------------------------------------------------------
_allowed_prefixes: tuple[str, ...] = ()


def set_allowed_endpoints(prefixes: list[str]) -> None:
    """Only endpoints starting with one of these URL prefixes are pushed to; empty allows every endpoint."""
    global _allowed_prefixes
    _allowed_prefixes = tuple(prefixes)


def allowed(url: str) -> bool:
    if not (url.startswith("http://") or url.startswith("https://")):
        return False
    return not _allowed_prefixes or url.startswith(_allowed_prefixes)


# --- request formats -------------------------------------------------------------------------------
def wrapped_request(msg, subscription: str, delivery_attempt: int) -> tuple[dict[str, str], bytes]:
    """The default format: a JSON envelope. `delivery_attempt` is 0 without a dead-letter policy."""
    mid = msg.message_id
    published = msg.publish_time.ToJsonString()
    m = {
        "data": base64.b64encode(msg.data).decode(),
        "attributes": dict(msg.attributes),
        "messageId": mid,
        "message_id": mid,
        "publishTime": published,
        "publish_time": published,
    }
    if msg.ordering_key:
        m["orderingKey"] = msg.ordering_key
    body = {"message": m, "subscription": subscription}
    if delivery_attempt:
        body["deliveryAttempt"] = delivery_attempt
    return {"Content-Type": "application/json"}, json.dumps(body).encode()


def unwrapped_request(msg, subscription: str, write_metadata: bool) -> tuple[dict[str, str], bytes]:
    """no_wrapper: the raw data; with write_metadata the attributes and message fields as headers.
    Attributes that cannot travel as a header (a name that is no HTTP token or frames the request, a value
    with CR, LF or NUL) are left out rather than corrupting the request."""
    headers = {"Content-Type": "application/octet-stream"}
    if write_metadata:
        for k, v in msg.attributes.items():
            if _TOKEN.match(k) and k.lower() not in _RESERVED_HEADERS and not any(c in v for c in "\r\n\0"):
                headers[k] = v
        headers["x-goog-pubsub-message-id"] = msg.message_id
        headers["x-goog-pubsub-publish-time"] = msg.publish_time.ToJsonString()
        headers["x-goog-pubsub-subscription-name"] = subscription
        if msg.ordering_key:
            headers["x-goog-pubsub-ordering-key"] = msg.ordering_key
    return headers, msg.data


def push_request(push_config, msg, subscription: str, delivery_attempt: int) -> tuple[dict[str, str], bytes]:
    if push_config.HasField("no_wrapper"):
        return unwrapped_request(msg, subscription, push_config.no_wrapper.write_metadata)
    return wrapped_request(msg, subscription, delivery_attempt)  # pubsub_wrapper, or neither set


# --- flow control ----------------------------------------------------------------------------------
class Window:
    """How many requests one subscription may have in flight, and when it may send again. Pure: times are
    passed in (the event loop's monotonic clock)."""

    __slots__ = ("size", "inflight", "paused_until", "backoff_s")

    def __init__(self):
        self.size = push_window_start
        self.inflight = 0
        self.paused_until = 0.0
        self.backoff_s = 0.0  # the current pause after a failure; 0 after a success

    def room(self, now: float) -> int:
        if now < self.paused_until:
            return 0
        return max(0, self.size - self.inflight)

    def sent(self, n: int) -> None:
        self.inflight += n

    def succeeded(self) -> None:
        self.inflight -= 1
        self.size = min(push_window_max, self.size + 1)
        self.backoff_s = 0.0
        self.paused_until = 0.0

    def failed(self, now: float) -> None:
        self.inflight -= 1
        self.size = max(1, self.size // 2)
        self.backoff_s = min(push_backoff_s_max, max(push_backoff_s_min, self.backoff_s * 2))
        self.paused_until = max(self.paused_until, now + self.backoff_s)

    def ended(self) -> None:
        """A request that was neither answered nor failed (cancelled)."""
        self.inflight -= 1


# --- the shell -------------------------------------------------------------------------------------
class PushManager:
    """Owns one worker task per push subscription and the HTTP session they share."""

    def __init__(self, engine):
        self.engine = engine
        config = engine.config
        if config.push_signing_key:  # read now, before the node starts: a key that cannot be used stops it
            try:
                key, kid = push_tokens.read_signing_key(config.push_signing_key)
            except (OSError, ValueError) as e:
                raise SystemExit(f"pigeon: cannot sign push tokens with --push-signing-key "
                                 f"{config.push_signing_key}: {e}") from None
            self.signer = push_tokens.TokenSigner(key, kid)
        else:  # the data directory's, read (or made) when first needed: a start without push pays nothing
            self.signer = push_tokens.TokenSigner(load=lambda: push_tokens.signing_key(config))
        self.workers: dict[int, PushWorker] = {}
        self._session: "aiohttp.ClientSession | None" = None
        self._started = False

    def start(self) -> None:
        """Start a worker for every push subscription already known (after the engine's recovery)."""
        self._started = True
        push_tokens.publish(self.signer)
        for uid in list(self.engine.state.subs_by_uid):
            self.subscription_changed(uid)

    async def stop(self) -> None:
        """Cancel every worker (requests in flight end unanswered: their leases die with the process or
        run out) and close the HTTP session."""
        self._started = False
        push_tokens.withdraw(self.signer)
        workers, self.workers = list(self.workers.values()), {}
        for w in workers:
            w.task.cancel()
        await asyncio.gather(*(w.task for w in workers), return_exceptions=True)
        if self._session is not None:
            await self._session.close()
            self._session = None

    def subscription_changed(self, sub) -> None:
        """After create/update/delete/detach/ModifyPushConfig: `sub` is the SubscriptionState or its uid."""
        uid = sub if isinstance(sub, int) else sub.uid
        s = self.engine.state.subs_by_uid.get(uid)
        w = self.workers.get(uid)
        if w is not None and not w.task.done():
            sig = self.engine.signals.get(uid)
            if sig is not None:
                sig.notify_all()  # the worker re-reads the configuration (and ends when no longer wanted)
            return
        if self._started and not self.engine.closing and s is not None and wanted(s):
            self.session  # (aiohttp is loaded with the first push subscription, not in its first push's path)
            self.workers[uid] = PushWorker(self, uid)
        elif s is not None and s.config.push_config.push_endpoint and not allowed(s.config.push_config.push_endpoint):
            log.warning("not pushing %s: endpoint %s is not allowed", s.name, s.config.push_config.push_endpoint)

    def forget(self, worker: PushWorker) -> None:
        if self.workers.get(worker.uid) is worker:
            del self.workers[worker.uid]

    @property
    def session(self) -> "aiohttp.ClientSession":
        if self._session is None:
            import aiohttp  # here, not at the top: ~0.25 s of start-up for servers without push subscriptions

            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=push_connections_max, limit_per_host=0),
                auto_decompress=False,
            )
        return self._session


def wanted(s) -> bool:
    """Whether the subscription should be pushed now."""
    endpoint = s.config.push_config.push_endpoint
    return bool(endpoint) and not s.detached and allowed(endpoint)


class PushWorker:
    """Pushes one subscription's messages. It is the lease owner of what it has in flight: the subscription
    calls `release(num)` when a lease ends for any reason."""

    def __init__(self, manager: PushManager, uid: int):
        self.manager = manager
        self.engine = manager.engine
        self.uid = uid
        self.window = Window()
        self.held: dict[int, int] = {}  # message number → delivery version, leased to this worker
        self.requests: set[asyncio.Task] = set()
        self.task = asyncio.get_running_loop().create_task(self._run())
        self.task.add_done_callback(lambda _: manager.forget(self))

    def release(self, num: int) -> None:
        self.held.pop(num, None)

    def release_all(self, nums: list[int]) -> None:
        for num in nums:
            self.release(num)

    def _sub(self):
        return self.engine.state.subs_by_uid.get(self.uid)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        engine = self.engine
        try:
            while True:
                s = self._sub()
                live = s is not None and not engine.closing and wanted(s)
                if not live:  # let the requests in flight finish (checking now and then for a change back)
                    if not self.requests:
                        return
                    await asyncio.wait(self.requests, timeout=push_wait_s_max)
                    continue
                now = loop.time()
                room = self.window.room(now)
                try:
                    if room and self._push_some(s, room):
                        continue
                except Exception:  # e.g. a message that cannot be read: its lease runs out, it comes back
                    log.exception("push for %s failed", s.name)
                    room = 0
                await engine.signal(self.uid).wait(self._wait_s(s, room, now))
        finally:
            for t in list(self.requests):
                t.cancel()
            if self.requests:
                await asyncio.gather(*self.requests, return_exceptions=True)

    def _wait_s(self, s, room: int, now: float) -> float:
        wait = push_wait_s_max
        if self.window.paused_until > now:
            wait = min(wait, self.window.paused_until - now)
        if room:  # a lease running out or a backoff ending makes messages ready
            d = s.next_deadline()
            if d is not None:
                wait = min(wait, d - self.engine.clock.now())
        return max(0.001, wait)

    def _push_some(self, s, room: int) -> int:
        """Lease up to `room` messages and start a request for each; returns how many."""
        engine = self.engine
        taken, msgs = engine.delivery.lease(s, room, s.ack_deadline_s, self, 1 if s.ordered else 0)
        if not taken:
            return 0
        loop = asyncio.get_running_loop()
        recording = engine.delivery.recording(s)
        until = engine.clock.now() + s.ack_deadline_s
        for (num, version), (body, tail) in zip(taken, msgs):
            if num in s.leases:  # an acked message resent with its ordered batch has no lease
                self.held[num] = version
            self.window.sent(1)
            t = loop.create_task(self._deliver(s, num, version, body + tail, recording, until))
            self.requests.add(t)
            t.add_done_callback(self.requests.discard)
        return len(taken)

    async def _deliver(self, s, num: int, version: int, raw: bytes, recording: asyncio.Future | None,
                       until: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            if recording is not None:  # (in a cluster: the lease replicated before the message goes out)
                await asyncio.shield(recording)
                if not self.engine.delivery.lease_left(until, s.ack_deadline_s):
                    raise Unavailable("its lease ran out before it was recorded")
            if s.transforms:  # the subscription's message transforms: one filtered out is acked unsent
                raw = await self.engine.transforms.push_message(s, raw)
            failure = None if raw is None else raw if isinstance(raw, Failure) else await self._post(s, version, raw)
        except PigeonError as e:  # the bundle moved: the lease was not recorded, the message is not sent
            failure = e.message
        except asyncio.CancelledError:
            self.window.ended()
            raise
        except Exception as e:  # a bug here must not leak the window slot or the lease
            log.exception("push for %s failed", s.name)
            failure = repr(e)
        ok = failure is None
        if ok:
            self.window.succeeded()
        else:
            if self.window.backoff_s == 0:  # the first failure after a success: say so once
                log.warning("push to %s for %s failed: %s", s.config.push_config.push_endpoint, s.name, failure)
            self.window.failed(loop.time())
        self._settle(s, num, version, ok)
        sig = self.engine.signals.get(self.uid)
        if sig is not None:
            sig.notify()  # room in the window

    async def _post(self, s, version: int, raw: bytes) -> str | None:
        """POST one message; None when the answer acks it, else why not."""
        pc = s.config.push_config
        endpoint = pc.push_endpoint
        msg = _PubsubMessage.FromString(raw)
        headers, body = push_request(pc, msg, s.name, version if s.max_attempts else 0)
        if pc.HasField("oidc_token"):
            oidc = pc.oidc_token
            try:
                await self.manager.signer.ready()
            except (OSError, ValueError) as e:  # (the data directory's key cannot be read or written)
                return f"cannot sign its OIDC token: {e}"
            tok = self.manager.signer.token(
                oidc.service_account_email, oidc.audience or endpoint, self.engine.clock.now()
            )
            headers["Authorization"] = "Bearer " + tok
        import aiohttp  # loaded once the manager made its session

        try:
            async with self.manager.session.post(
                endpoint,
                data=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=s.ack_deadline_s),
                allow_redirects=False,
            ) as r:
                await r.content.read(push_response_bytes_max)
                return None if r.status in ACK_STATUSES else f"answered {r.status}"
        except asyncio.TimeoutError:
            return f"no answer within the ack deadline ({s.ack_deadline_s}s)"
        except (aiohttp.ClientError, OSError, ValueError) as e:
            return repr(e)

    def _settle(self, s, num: int, version: int, ok: bool) -> None:
        if self.held.get(num) != version:
            return  # the lease ended while the request was in flight: the subscription settled it
        del self.held[num]
        if self._sub() is not s:
            return  # deleted meanwhile
        ack_id = ackid.make(self.uid, num, version, s.generation_of(num))
        if ok:
            self.engine.delivery.ack_nowait(s, [ack_id])
        else:
            self.engine.delivery.modify_deadlines(s, [ack_id], [0])
