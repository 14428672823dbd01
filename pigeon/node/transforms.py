"""Single message transforms: Pub/Sub's JavaScript UDFs, run in an embedded V8 (mini-racer). Owns the rules: a
topic's transforms run at publish, before the messages are stored — a message a UDF returns null for is not stored
(its publisher still gets an id), and a UDF that throws fails the whole publish with INVALID_ARGUMENT; a
subscription's run at delivery — a message filtered out is acked, one a UDF throws on is a failed delivery (nacked:
retried with the subscription's backoff, dead-lettered past its attempts); the code must compile and define its
`function_name` when a resource is created or updated; a message may take limits.transform_message_s_max of
JavaScript time through a resource's transforms.

The shape of the transforms (how many, code size, names) is broker.resources'. One isolate per node process,
bound to the node's event loop: a batch of messages (a publish request, a delivery) is one call into V8, which runs
on V8's own thread while the loop goes on; each chain of UDFs is compiled once and kept. The function receives
(message, metadata): message.data is the payload as a string (UTF-8; bytes that are not UTF-8 come back unchanged
when the UDF leaves them alone), message.attributes an object of strings; metadata has message_id, publish_time
(YYYY-MM-DDTHH:MM:SSZ) and ordering_key where known (a topic's transforms run before the message has an id)."""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
import uuid
from collections import OrderedDict

from pigeon.broker import commands, resources
from pigeon.core import limits
from pigeon.core.errors import InvalidArgument
from pigeon.core.pubsub_types import types

log = logging.getLogger("pigeon.transforms")

_PublishRequest = types.PublishRequest.pb()
_PullResponse = types.PullResponse.pb()
_PubsubMessage = types.PubsubMessage.pb()

# The harness: chains are compiled with `new Function` (each UDF's code in a scope of its own, so two resources'
# functions of one name do not clash) and run over a batch; results come back as one JSON text. It never throws:
# a UDF's exception, or a result that is not a message, is that message's failure.
_HARNESS = r"""
var __pigeon = new Map();
function __pigeon_define(id, udfs) {
  const fns = [];
  for (const [name, code] of udfs) {
    let f;
    try {
      f = (new Function(code + "\n;return typeof " + name + " === 'function' ? " + name + " : undefined;"))();
    } catch (e) { return JSON.stringify({error: name + ": " + String(e)}); }
    if (typeof f !== "function") return JSON.stringify({error: "the code does not define a function " + name});
    fns.push(f);
  }
  __pigeon.set(id, fns);
  return JSON.stringify({ok: true});
}
function __pigeon_check(m) {
  if (m === null || typeof m !== "object" || typeof m.data !== "string")
    throw new TypeError("a transform must return null or an object with data as a string");
  const a = m.attributes === undefined || m.attributes === null ? {} : m.attributes;
  if (typeof a !== "object") throw new TypeError("attributes must be an object of strings");
  for (const k in a) if (typeof a[k] !== "string") throw new TypeError("attribute " + k + " is not a string");
  return {data: m.data, attributes: a};
}
function __pigeon_run(id, batch) {
  const fns = __pigeon.get(id);
  const out = [];
  for (const [message, metadata] of batch) {
    let m = message, failed = null;
    for (let i = 0; i < fns.length && m !== null; i++) {
      try {
        m = fns[i](m, Object.freeze(metadata));
        if (m !== null) m = __pigeon_check(m);
      } catch (e) { failed = [i, String(e)]; break; }
    }
    out.push(failed !== null ? {failed: failed} : m === null ? null : [m.data, m.attributes]);
  }
  return JSON.stringify(out);
}
"""


class Failure(str):
    """Why a message's transforms failed (the error the UDF threw, or the limit it passed)."""


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _bytes(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


class Transforms:
    def __init__(self):
        self._racer = None
        self._racer_cm = None
        self._chains: OrderedDict[tuple, int] = OrderedDict()  # (function_name, code) pairs → compiled chain id
        self._next_id = 0

    # --- the isolate -------------------------------------------------------------------------------
    def _mr(self):
        if self._racer is None:
            from py_mini_racer import mini_racer  # V8 is loaded by the first node that has a transform

            self._racer_cm = mini_racer(asyncio.get_running_loop())
            self._racer = self._racer_cm.__enter__()
            self._racer.set_hard_memory_limit(limits.transform_heap_bytes_max)
            self._racer.eval(_HARNESS)
        return self._racer

    def close(self) -> None:
        if self._racer_cm is not None:
            self._racer_cm.__exit__(None, None, None)
        self._racer = self._racer_cm = None
        self._chains.clear()

    async def _call(self, code: str, timeout_s: float):
        from py_mini_racer import JSEvalException

        try:
            return json.loads(await asyncio.wait_for(self._mr().eval_cancelable(code), timeout_s))
        except asyncio.TimeoutError:
            return None
        except JSEvalException as e:  # out of memory (the harness catches the rest): start a fresh isolate
            log.warning("JavaScript transforms: %s; the isolate starts over", str(e).splitlines()[0])
            self.close()
            return None

    async def _chain(self, udfs) -> tuple[int | None, str | None]:
        """The compiled chain of `udfs` (id, None), or (None, why it does not compile)."""
        key = tuple((u.function_name, u.code) for u in udfs)
        cid = self._chains.get(key)
        if cid is not None and self._racer is not None:
            self._chains.move_to_end(key)
            return cid, None
        self._next_id += 1
        cid = self._next_id
        said = await self._call(f"__pigeon_define({cid}, {json.dumps([list(k) for k in key])})",
                                limits.transform_batch_s_max)
        if said is None:
            return None, f"compiling took longer than {limits.transform_batch_s_max:g} s"
        if "error" in said:
            return None, said["error"]
        self._chains[key] = cid
        if len(self._chains) > limits.transform_chains_max:
            _, old = self._chains.popitem(last=False)
            await self._call(f"__pigeon.delete({old}), 0", limits.transform_batch_s_max)
        return cid, None

    # --- validation --------------------------------------------------------------------------------
    async def check(self, transforms) -> None:
        """A resource's `message_transforms` as a create or update gives them: shaped right, compiling, each
        defining its function (INVALID_ARGUMENT naming the UDF otherwise)."""
        resources.check_transforms(transforms)
        for i, m in enumerate(transforms):
            _, why = await self._chain([m.javascript_udf])
            if why is not None:
                raise InvalidArgument(f"Invalid message_transforms[{i}].javascript_udf: {why}.")

    # --- running -----------------------------------------------------------------------------------
    async def run(self, udfs, batch: list[tuple[bytes, dict, dict]]) -> list:
        """Each (data, attributes, metadata) through the chain `udfs`: None (filtered out), (data, attributes),
        or a Failure. A batch that overruns its time is run again message by message, so only the slow one fails."""
        cid, why = await self._chain(udfs)
        if cid is None:
            return [Failure(why)] * len(batch)
        out = await self._run(cid, batch)
        if out is not None:
            return out
        if len(batch) == 1:
            return [Failure(f"the transforms took longer than {limits.transform_message_s_max:g} s")]
        return [r for item in batch for r in await self.run(udfs, [item])]

    async def _run(self, cid: int, batch) -> list | None:
        arg = json.dumps([[{"data": _text(d), "attributes": dict(a)}, md] for d, a, md in batch])
        timeout = min(limits.transform_batch_s_max, limits.transform_message_s_max * len(batch))
        got = await self._call(f"__pigeon_run({cid}, {arg})", timeout)
        if got is None:
            return None
        return [r if r is None else Failure(f"UDF {r['failed'][0]}: {r['failed'][1]}") if isinstance(r, dict)
                else (_bytes(r[0]), r[1]) for r in got]

    async def publish(self, engine, t, request: bytes, ordering_key: str) -> list[str]:
        """A publish to a topic with transforms: the request as the transforms leave it is validated again and
        stored (engine.publish); a message filtered out is not stored and answers with an id of its own."""
        udfs = resources.active_transforms(t.config.message_transforms)
        req = _PublishRequest.FromString(request)
        meta = {"ordering_key": ordering_key} if ordering_key else {}
        results = await self.run(udfs, [(m.data, m.attributes, meta) for m in req.messages]) if udfs else \
            [(m.data, dict(m.attributes)) for m in req.messages]
        kept, filtered = [], []
        for i, (m, r) in enumerate(zip(req.messages, results)):
            if isinstance(r, Failure):
                raise InvalidArgument(f"The topic's message transforms failed on message {i} of the publish "
                                      f"request, so nothing was published: {r}")
            if r is None:
                filtered.append(i)
                continue
            m.data = r[0]
            m.attributes.clear()
            m.attributes.update(r[1])
            kept.append(m)
        ids = []
        if kept:
            del req.messages[:]
            req.messages.extend(kept)
            try:
                cmd = commands.check_publish(req.SerializeToString())
            except InvalidArgument as e:
                raise InvalidArgument(f"After the topic's message transforms: {e.message}") from None
            ids = await engine.publish(cmd.topic, cmd.request, cmd.count, cmd.ordering_key, cmd.idempotency_keys,
                                       cmd.activations, transformed=True)
        for i in filtered:  # an id like no stored message's: the publisher's future resolves, nothing is kept
            ids.insert(i, f"filtered-{uuid.uuid4().hex}")
        return ids

    async def deliver(self, delivery, s, out: list[bytes]) -> list[bytes]:
        """Encoded received_messages entries of subscription `s`, leased, through its transforms: filtered ones
        acked, failed ones nacked (a failed delivery), the rest re-encoded as the transforms left them."""
        rms = _PullResponse.FromString(b"".join(out)).received_messages
        results = await self.run(resources.active_transforms(s.config.message_transforms),
                                 [(rm.message.data, rm.message.attributes, _metadata(rm.message)) for rm in rms])
        kept, acks, nacks = [], [], []
        for rm, r in zip(rms, results):
            if r is None:
                acks.append(rm.ack_id)
            elif isinstance(r, Failure):
                nacks.append(rm.ack_id)
                log.info("message transforms of %s failed on message %s: %s", s.name, rm.message.message_id, r)
            else:
                rm.message.data = r[0]
                rm.message.attributes.clear()
                rm.message.attributes.update(r[1])
                kept.append(_PullResponse(received_messages=[rm]).SerializeToString())
        if delivery.executor.state.subs_by_uid.get(s.uid) is s:  # (not deleted while V8 ran)
            if acks:
                delivery.ack_nowait(s, acks)
            if nacks:
                delivery.modify_deadlines(s, nacks, [0] * len(nacks))
        return kept

    async def push_message(self, s, raw: bytes) -> bytes | None | Failure:
        """A stored PubsubMessage a push subscription is about to send, through its transforms: the message to
        send, None (filtered out: acked), or a Failure (nacked)."""
        msg = _PubsubMessage.FromString(raw)
        (r,) = await self.run(resources.active_transforms(s.config.message_transforms),
                              [(msg.data, msg.attributes, _metadata(msg))])
        if r is None or isinstance(r, Failure):
            return r
        msg.data = r[0]
        msg.attributes.clear()
        msg.attributes.update(r[1])
        return msg.SerializeToString()


@functools.lru_cache(maxsize=64)
def _rfc3339(seconds: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(seconds))  # (messages of a batch share a few seconds)


def _metadata(m) -> dict:
    md = {"message_id": m.message_id, "publish_time": _rfc3339(m.publish_time.seconds)}
    if m.ordering_key:
        md["ordering_key"] = m.ordering_key
    return md
