"""A lean AMQP 0-9-1 connection for the benchmark's hot paths (pamqp marshals the handshake and the frames that
are built once). Owns the rule: publish frames are serialized before the clock starts and sent as one buffer per
window; incoming frames are split in place, and only the fields counted are read (delivery tags, confirm tags)."""

from __future__ import annotations

import asyncio

from pamqp import commands as C
from pamqp import frame
from pamqp.body import ContentBody
from pamqp.header import ContentHeader, ProtocolHeader

CH = 1
_ACK = b"\x00\x3c\x00\x50"  # basic.ack: class 60, method 80
_NACK = b"\x00\x3c\x00\x78"  # basic.nack: class 60, method 120
_DELIVER = b"\x00\x3c\x00\x3c"  # basic.deliver: class 60, method 60
FRAME_END = b"\xce"


def publish_frames(queue: str, bodies: list[bytes], persistent: bool = True) -> bytes:
    props = C.Basic.Properties(delivery_mode=2 if persistent else 1)
    out = bytearray()
    for body in bodies:
        out += frame.marshal(C.Basic.Publish(exchange="", routing_key=queue), CH)
        out += frame.marshal(ContentHeader(0, len(body), props), CH)
        out += frame.marshal(ContentBody(body), CH)
    return bytes(out)


def ack_frame(tag: int, multiple: bool = True) -> bytes:
    return b"\x01\x00\x01\x00\x00\x00\x0d" + _ACK + tag.to_bytes(8, "big") + (b"\x01" if multiple else b"\x00") \
        + FRAME_END


class AmqpWire:
    """One connection with one channel. `on_confirm(tag, multiple, nack)` and `on_deliver(tag)` /
    `on_body(payload)` are called from the read loop."""

    def __init__(self):
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self._buf = bytearray()
        self.on_confirm = lambda tag, multiple, nack: None
        self.on_deliver = lambda tag: None
        self.on_body = lambda payload: None
        self._task: asyncio.Task | None = None

    async def _frame(self):
        """Read one frame during setup (not on the hot path)."""
        while True:
            if len(self._buf) >= 7:
                size = int.from_bytes(self._buf[3:7], "big")
                if len(self._buf) >= 8 + size:
                    used, _ch, value = frame.unmarshal(bytes(self._buf[:8 + size]))
                    del self._buf[:used]
                    return value
            data = await self.reader.read(1 << 16)
            if not data:
                raise ConnectionError("AMQP connection closed during setup")
            self._buf += data

    async def _expect(self, kind):
        v = await self._frame()
        if isinstance(v, (C.Connection.Close, C.Channel.Close)):
            raise ConnectionError(f"AMQP server closed: {v.reply_code} {v.reply_text}")
        assert isinstance(v, kind), f"expected {kind.__name__}, got {type(v).__name__}"
        return v

    def _send(self, value, channel: int = CH) -> None:
        self.writer.write(frame.marshal(value, channel))

    async def open(self, host: str, port: int, user: str = "guest", password: str = "guest",
                   confirms: bool = False) -> "AmqpWire":
        self.reader, self.writer = await asyncio.open_connection(host, port)
        self.writer.write(frame.marshal(ProtocolHeader(), 0))
        await self._expect(C.Connection.Start)
        self._send(C.Connection.StartOk(client_properties={"product": "pigeon-bench"}, mechanism="PLAIN",
                                        response=f"\0{user}\0{password}"), 0)
        tune = await self._expect(C.Connection.Tune)
        self._send(C.Connection.TuneOk(channel_max=tune.channel_max, frame_max=tune.frame_max, heartbeat=0), 0)
        self._send(C.Connection.Open(virtual_host="/"), 0)
        await self._expect(C.Connection.OpenOk)
        self._send(C.Channel.Open())
        await self._expect(C.Channel.OpenOk)
        if confirms:
            self._send(C.Confirm.Select())
            await self._expect(C.Confirm.SelectOk)
        return self

    async def consume(self, queue: str, prefetch: int) -> None:
        self._send(C.Basic.Qos(prefetch_count=prefetch))
        await self._expect(C.Basic.QosOk)
        self._send(C.Basic.Consume(queue=queue, consumer_tag="bench"))
        await self._expect(C.Basic.ConsumeOk)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._read_loop())

    async def _read_loop(self) -> None:
        buf = self._buf
        on_confirm, on_deliver, on_body = self.on_confirm, self.on_deliver, self.on_body
        while True:
            n = len(buf)
            pos = 0
            while n - pos >= 8:
                size = int.from_bytes(buf[pos + 3:pos + 7], "big")
                end = pos + 8 + size
                if end > n:
                    break
                kind = buf[pos]
                if kind == 1:
                    head = buf[pos + 7:pos + 11]
                    if head == _DELIVER:
                        ctag = buf[pos + 11]
                        at = pos + 12 + ctag
                        on_deliver(int.from_bytes(buf[at:at + 8], "big"))
                    elif head == _ACK or head == _NACK:
                        on_confirm(int.from_bytes(buf[pos + 11:pos + 19], "big"), bool(buf[pos + 19] & 1),
                                   head == _NACK)
                    else:
                        _u, _c, value = frame.unmarshal(bytes(buf[pos:end]))
                        if isinstance(value, (C.Connection.Close, C.Channel.Close)):
                            raise ConnectionError(f"AMQP server closed: {value.reply_code} {value.reply_text}")
                elif kind == 3:
                    on_body(buf[pos + 7:end - 1])
                pos = end
            if pos:
                del buf[:pos]
            data = await self.reader.read(1 << 20)
            if not data:
                return
            buf += data

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    async def drain(self) -> None:
        await self.writer.drain()

    async def close(self) -> None:
        if self._task:
            self._task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


class ConfirmTracker:
    """The contiguous prefix of confirmed publish tags (confirms may be single or `multiple`)."""

    def __init__(self):
        self.upto = 0
        self._singles: set[int] = set()
        self.nacks = 0
        self.changed = asyncio.Event()

    def __call__(self, tag: int, multiple: bool, nack: bool) -> None:
        if nack:
            self.nacks += 1
        if multiple:
            if tag > self.upto:
                self.upto = tag
        elif tag > self.upto:
            self._singles.add(tag)
        while self.upto + 1 in self._singles:
            self.upto += 1
            self._singles.discard(self.upto)
        if self._singles:
            self._singles = {t for t in self._singles if t > self.upto}
        self.changed.set()

    async def wait_for(self, tag: int, timeout_s: float = 60.0) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.upto < tag:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), max(0.0, deadline - loop.time()))
