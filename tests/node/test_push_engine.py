"""Push delivery in-process: the engine on a simulated clock pushing to a real aiohttp receiver on
loopback. Real time only in small doses (polling with sub-second steps and short timeouts)."""

from __future__ import annotations

import asyncio
import base64
import json
import time

from aiohttp import web
from google.auth import jwt as google_jwt
from test_engine import PB, S, T, config, started

from pigeon.node import push
from pigeon.testing.clock import SimClock
from pigeon.testing.server import free_port

DLT = "projects/p/topics/dead-letters"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 20))


class Receiver:
    """Records every POST; `answer(request_record)` (may be async) gives the status to reply with."""

    def __init__(self):
        self.got: list[dict] = []
        self.answer = lambda rec: 200
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/push"
        self._runner: web.AppRunner | None = None

    async def __aenter__(self):
        app = web.Application()
        app.router.add_post("/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self

    async def __aexit__(self, *exc):
        await self._runner.cleanup()

    async def _handle(self, request: web.Request) -> web.Response:
        rec = {"headers": dict(request.headers), "body": await request.read(), "path": request.path,
               "at": time.monotonic()}
        if rec["headers"].get("Content-Type") == "application/json":
            rec["json"] = json.loads(rec["body"])
        self.got.append(rec)
        status = self.answer(rec)
        if asyncio.iscoroutine(status):
            status = await status
        rec["answered"] = time.monotonic()
        return web.Response(status=status)

    def datas(self) -> list[bytes]:
        return [base64.b64decode(r["json"]["message"]["data"]) if "json" in r else r["body"] for r in self.got]


async def until(pred, timeout: float = 5.0, r: Receiver | None = None) -> None:
    give_up = time.monotonic() + timeout
    while not pred():
        seen = r.datas() if r is not None else "-"
        assert time.monotonic() < give_up, f"condition not reached in {timeout}s; received {seen}"
        await asyncio.sleep(0.01)


async def publish(e, datas, key: str = "", **attrs) -> list[str]:
    msgs = [PB["PubsubMessage"](data=d, attributes=attrs, ordering_key=key) for d in datas]
    raw = PB["PublishRequest"](topic=T, messages=msgs).SerializeToString()
    return await e.publish(T, raw, len(msgs), key)


async def push_setup(e, endpoint: str, **fields) -> None:
    await e.create_topic(PB["Topic"](name=T))
    push_config = fields.pop("push_config", {})
    push_config["push_endpoint"] = endpoint
    await e.create_subscription(PB["Subscription"](name=S, topic=T, push_config=push_config, **fields))


def backlog(e) -> int:
    s = e.state.subs[S]
    return s.backlog()


# --- pure parts ------------------------------------------------------------------------------------
def test_window_grows_by_one_halves_on_failure_and_pauses():
    w = push.Window()
    assert w.room(0.0) == push.push_window_start == 1
    for _ in range(9):
        w.sent(1)
        w.succeeded()
    assert w.size == 10 and w.room(0.0) == 10
    w.sent(3)
    w.failed(now=100.0)
    assert w.size == 5 and w.inflight == 2
    assert w.room(100.0) == 0 and w.room(100.0 + push.push_backoff_s_min) == 3  # paused, then room again
    w.sent(1)
    w.failed(now=200.0)
    assert w.backoff_s == 2 * push.push_backoff_s_min  # consecutive failures double the pause
    w.succeeded()
    assert w.backoff_s == 0 and w.room(200.0) == w.size - w.inflight
    for _ in range(1000):
        w.sent(1)
        w.succeeded()
    assert w.size == push.push_window_max


def test_allowed_endpoints():
    try:
        assert push.allowed("http://127.0.0.1:9/x") and push.allowed("https://example.com/")
        assert not push.allowed("ftp://example.com/") and not push.allowed("example.com")
        push.set_allowed_endpoints(["https://hooks.example.com/", "http://127.0.0.1:"])
        assert push.allowed("https://hooks.example.com/a") and push.allowed("http://127.0.0.1:8/x")
        assert not push.allowed("https://evil.example.com/")
    finally:
        push.set_allowed_endpoints([])


def test_unwrapped_headers_leave_out_attributes_that_cannot_be_headers():
    msg = PB["PubsubMessage"](data=b"d", message_id="7", ordering_key="k", attributes={
        "ok": "v", "Content-Length": "1", "host": "evil", "bad name": "x", "inject": "a\r\nb", "Authorization": "x"})
    msg.publish_time.FromSeconds(0)
    headers, body = push.unwrapped_request(msg, S, write_metadata=True)
    assert body == b"d"
    assert headers == {
        "Content-Type": "application/octet-stream",
        "ok": "v",
        "x-goog-pubsub-message-id": "7",
        "x-goog-pubsub-publish-time": "1970-01-01T00:00:00Z",
        "x-goog-pubsub-subscription-name": S,
        "x-goog-pubsub-ordering-key": "k",
    }


# --- against a receiver ----------------------------------------------------------------------------
def test_wrapped_format(tmp_path):
    async def go():
        async with Receiver() as r:
            e = await started(config(tmp_path), SimClock(1_700_000_000.5))
            await push_setup(e, r.url, enable_message_ordering=True)
            (mid,) = await publish(e, [b"hello"], key="k1", colour="red")
            await until(lambda: backlog(e) == 0, r=r)
            (rec,) = r.got
            assert rec["headers"]["Content-Type"] == "application/json"
            assert rec["json"] == {
                "message": {
                    "data": base64.b64encode(b"hello").decode(),
                    "attributes": {"colour": "red"},
                    "messageId": mid,
                    "message_id": mid,
                    "publishTime": "2023-11-14T22:13:20.500Z",
                    "publish_time": "2023-11-14T22:13:20.500Z",
                    "orderingKey": "k1",
                },
                "subscription": S,
            }
            assert "Authorization" not in rec["headers"]
            await e.stop()

    run(go())


def test_wrapped_format_carries_delivery_attempt_with_a_dead_letter_policy(tmp_path):
    async def go():
        async with Receiver() as r:
            r.answer = lambda rec: 500 if len(r.got) == 1 else 200
            e = await started(config(tmp_path), SimClock())
            await e.create_topic(PB["Topic"](name=DLT))
            await push_setup(
                e, r.url, push_config={"pubsub_wrapper": {}},
                dead_letter_policy={"dead_letter_topic": DLT, "max_delivery_attempts": 5},
                retry_policy={"minimum_backoff": {"seconds": 0}},
            )
            await publish(e, [b"x"])
            await until(lambda: backlog(e) == 0, r=r)
            assert [m["json"]["deliveryAttempt"] for m in r.got] == [1, 2]
            assert "orderingKey" not in r.got[0]["json"]["message"]
            await e.stop()

    run(go())


def test_failing_endpoint_dead_letters_after_max_attempts(tmp_path, monkeypatch):
    monkeypatch.setattr(push, "push_backoff_s_min", 0.01)  # the endpoint's pauses are not under test here

    async def go():
        async with Receiver() as r:
            r.answer = lambda rec: 500
            e = await started(config(tmp_path), SimClock())
            await e.create_topic(PB["Topic"](name=DLT))
            dls = "projects/p/subscriptions/dead-letters-sub"
            await e.create_subscription(PB["Subscription"](name=dls, topic=DLT))
            await push_setup(
                e, r.url, dead_letter_policy={"dead_letter_topic": DLT, "max_delivery_attempts": 5},
                retry_policy={"minimum_backoff": {"seconds": 0}},
            )
            await publish(e, [b"poison"])
            await until(lambda: backlog(e) == 0, timeout=8, r=r)
            assert [m["json"]["deliveryAttempt"] for m in r.got] == [1, 2, 3, 4, 5]
            got = PB["PullResponse"].FromString(b"".join(await e.delivery.pull(dls, 10, True))).received_messages
            assert [m.message.data for m in got] == [b"poison"]
            assert got[0].message.attributes["CloudPubSubDeadLetterSourceDeliveryCount"] == "5"
            await e.stop()

    run(go())


def test_no_wrapper_with_and_without_metadata(tmp_path):
    async def go():
        async with Receiver() as r:
            e = await started(config(tmp_path), SimClock(1_700_000_000.0))
            await push_setup(e, r.url, push_config={"no_wrapper": {"write_metadata": True}})
            (mid,) = await publish(e, [b"\x00raw bytes\xff"], key="", colour="blue", size="L")
            await until(lambda: backlog(e) == 0, r=r)
            (rec,) = r.got
            h = rec["headers"]
            assert rec["body"] == b"\x00raw bytes\xff"
            assert h["colour"] == "blue" and h["size"] == "L"
            assert h["x-goog-pubsub-message-id"] == mid
            assert h["x-goog-pubsub-publish-time"] == "2023-11-14T22:13:20Z"
            assert h["x-goog-pubsub-subscription-name"] == S
            assert "x-goog-pubsub-ordering-key" not in h

            sub = PB["Subscription"](name=S, push_config={"push_endpoint": r.url, "no_wrapper": {}})
            await e.update_subscription(sub, PB["FieldMask"](paths=["push_config"]))
            await publish(e, [b"plain"], colour="blue")
            await until(lambda: len(r.got) == 2 and backlog(e) == 0, r=r)
            h = r.got[1]["headers"]
            assert r.got[1]["body"] == b"plain"
            assert "colour" not in h and "x-goog-pubsub-message-id" not in h
            await e.stop()

    run(go())


def test_error_answer_nacks_and_retry_policy_backoff_applies(tmp_path):
    async def go():
        async with Receiver() as r:
            statuses = iter([500, 404, 200])
            r.answer = lambda rec: next(statuses)
            clock = SimClock()
            e = await started(config(tmp_path), clock)
            await push_setup(e, r.url, retry_policy={"minimum_backoff": {"seconds": 10},
                                                     "maximum_backoff": {"seconds": 20}})
            uid = e.state.subs[S].uid
            await publish(e, [b"m"])
            await until(lambda: len(r.got) == 1, r=r)
            await asyncio.sleep(0.3)
            assert len(r.got) == 1  # nacked: waits out its 10 s backoff (simulated)
            clock.advance(10)
            e.signal(uid).notify()
            await until(lambda: len(r.got) == 2, r=r)
            await asyncio.sleep(0.3)
            assert len(r.got) == 2  # second failure: 20 s
            clock.advance(20)
            e.signal(uid).notify()
            await until(lambda: backlog(e) == 0, r=r)
            assert r.datas() == [b"m"] * 3
            assert e.state.subs[S].leases == {}
            await e.stop()

    run(go())


def test_connection_refused_nacks_and_the_message_comes_back(tmp_path):
    async def go():
        async with Receiver() as r:
            e = await started(config(tmp_path), SimClock())
            dead = f"http://127.0.0.1:{free_port()}/nobody-home"
            await push_setup(e, dead, retry_policy={"minimum_backoff": {"seconds": 0}})
            await publish(e, [b"m"])
            s = e.state.subs[S]
            worker = e.push.workers[s.uid]
            await until(lambda: worker.window.backoff_s > 0 and not s.leases, r=r)
            sub = PB["Subscription"](name=S, push_config={"push_endpoint": r.url})
            await e.update_subscription(sub, PB["FieldMask"](paths=["push_config"]))
            await until(lambda: backlog(e) == 0, timeout=8, r=r)
            assert r.datas() == [b"m"]
            await e.stop()

    run(go())


def test_ordering_one_outstanding_message_per_key(tmp_path):
    async def go():
        async with Receiver() as r:
            async def answer(rec):
                if rec["body"] and b"a1" in base64.b64decode(rec["json"]["message"]["data"]):
                    await asyncio.sleep(0.4)
                return 200

            r.answer = answer
            e = await started(config(tmp_path), SimClock())
            await push_setup(e, r.url, enable_message_ordering=True)
            await publish(e, [b"warm%d" % i for i in range(6)])  # let the window grow past 1
            await until(lambda: backlog(e) == 0, r=r)
            await publish(e, [b"a1"], key="A")
            await publish(e, [b"a2"], key="A")
            await publish(e, [b"b1"], key="B")
            await until(lambda: backlog(e) == 0, r=r)
            by = {r.datas()[i]: rec for i, rec in enumerate(r.got)}
            assert by[b"a2"]["at"] >= by[b"a1"]["answered"]  # a2 waited for a1's ack
            assert by[b"b1"]["at"] < by[b"a1"]["answered"]  # key B did not wait for key A
            await e.stop()

    run(go())


def test_ordering_failure_redelivers_the_key_in_order(tmp_path):
    async def go():
        async with Receiver() as r:
            fails = {b"k2": 1}

            def answer(rec):
                d = base64.b64decode(rec["json"]["message"]["data"])
                if fails.get(d):
                    fails[d] -= 1
                    return 503
                return 200

            r.answer = answer
            e = await started(config(tmp_path), SimClock())
            await push_setup(e, r.url, enable_message_ordering=True, retry_policy={"minimum_backoff": {"seconds": 0}})
            await publish(e, [b"k1", b"k2", b"k3"], key="K")
            await until(lambda: backlog(e) == 0, r=r)
            assert r.datas() == [b"k1", b"k2", b"k2", b"k3"]
            await e.stop()

    run(go())


def test_oidc_token_is_a_verifiable_jwt(tmp_path):
    async def go():
        async with Receiver() as r:
            e = await started(config(tmp_path), SimClock(time.time()))
            sa = "pusher@p.iam.gserviceaccount.com"
            await push_setup(e, r.url, push_config={"oidc_token": {"service_account_email": sa}})
            await publish(e, [b"signed"])
            await until(lambda: backlog(e) == 0, r=r)
            auth = r.got[0]["headers"]["Authorization"]
            assert auth.startswith("Bearer ")
            pem = e.push.signer.public_pem()
            claims = google_jwt.decode(auth[len("Bearer "):], certs=pem, audience=r.url)  # aud = the endpoint
            assert claims["iss"] == "https://accounts.google.com"
            assert claims["email"] == sa and claims["email_verified"] is True
            assert claims["exp"] - claims["iat"] == 3600

            sub = PB["Subscription"](name=S, push_config={
                "push_endpoint": r.url, "oidc_token": {"service_account_email": sa, "audience": "my-app"}})
            await e.update_subscription(sub, PB["FieldMask"](paths=["push_config"]))
            await publish(e, [b"again"])
            await until(lambda: len(r.got) == 2 and backlog(e) == 0, r=r)
            tok = r.got[1]["headers"]["Authorization"][len("Bearer "):]
            assert google_jwt.decode(tok, certs=pem, audience="my-app")["aud"] == "my-app"
            await e.stop()

    run(go())


def test_switching_to_pull_stops_the_worker_and_detach_stops_pushing(tmp_path):
    async def go():
        async with Receiver() as r:
            e = await started(config(tmp_path), SimClock())
            await push_setup(e, r.url)
            uid = e.state.subs[S].uid
            await publish(e, [b"pushed"])
            await until(lambda: backlog(e) == 0, r=r)
            await e.update_subscription(PB["Subscription"](name=S, push_config={}),
                                        PB["FieldMask"](paths=["push_config"]))
            await until(lambda: uid not in e.push.workers, r=r)
            await publish(e, [b"pulled"])
            got = PB["PullResponse"].FromString(b"".join(await e.delivery.pull(S, 10, True))).received_messages
            assert [m.message.data for m in got] == [b"pulled"]
            await e.delivery.acknowledge(S, [got[0].ack_id])
            await e.update_subscription(PB["Subscription"](name=S, push_config={"push_endpoint": r.url}),
                                        PB["FieldMask"](paths=["push_config"]))
            assert uid in e.push.workers
            await publish(e, [b"pushed again"])
            await until(lambda: backlog(e) == 0, r=r)
            assert r.datas() == [b"pushed", b"pushed again"]
            await e.detach_subscription(S)
            await until(lambda: uid not in e.push.workers, r=r)
            await e.stop()

    run(go())


def test_restart_resumes_pushing(tmp_path):
    async def go():
        async with Receiver() as r:
            r.answer = lambda rec: 503
            cfg = config(tmp_path)
            e = await started(cfg, SimClock())
            await push_setup(e, r.url, retry_policy={"minimum_backoff": {"seconds": 600}})
            await publish(e, [b"survivor"])
            await until(lambda: len(r.got) == 1, r=r)
            await e.stop()
            r.answer = lambda rec: 200
            e2 = await started(cfg, SimClock())
            await until(lambda: backlog(e2) == 0, r=r)
            assert r.datas() == [b"survivor", b"survivor"]
            await e2.stop()

    run(go())
