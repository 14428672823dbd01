"""A lean NATS client connection for the benchmark's hot paths. Owns the rule: PUB frames are serialized before the
clock starts and sent as one buffer per window; incoming MSG/HMSG frames are split in place and handed on as
(subject, reply, payload) without building message objects."""

from __future__ import annotations

import asyncio
import json


def pub_frames(subject: str, reply: str, payload: bytes, count: int) -> bytes:
    one = f"PUB {subject} {reply} {len(payload)}\r\n".encode() + payload + b"\r\n"
    return one * count


class NatsWire:
    """One connection. `on_msg(sid, reply, payload, status)` is called for every MSG/HMSG (status: the HMSG
    status code such as b"408", else None)."""

    def __init__(self):
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.on_msg = lambda sid, reply, payload, status: None
        self._task: asyncio.Task | None = None
        self._buf = bytearray()
        self._pong = asyncio.Event()
        self.error: Exception | None = None

    async def open(self, host: str, port: int) -> "NatsWire":
        self.reader, self.writer = await asyncio.open_connection(host, port, limit=1 << 24)
        info = await self.reader.readline()
        assert info.startswith(b"INFO"), info[:80]
        opts = {"verbose": False, "pedantic": False, "headers": True, "no_responders": True, "protocol": 1,
                "lang": "python", "version": "pigeon-bench"}
        self.writer.write(b"CONNECT " + json.dumps(opts).encode() + b"\r\n")
        self._task = asyncio.ensure_future(self._read_loop())
        await self.flush()
        return self

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def sub(self, subject: str, sid: int) -> None:
        self.writer.write(f"SUB {subject} {sid}\r\n".encode())

    def pub(self, subject: str, payload: bytes, reply: str = "") -> None:
        head = f"PUB {subject} {reply} {len(payload)}\r\n" if reply else f"PUB {subject} {len(payload)}\r\n"
        self.writer.write(head.encode() + payload + b"\r\n")

    async def flush(self, timeout_s: float = 30.0) -> None:
        """PING and wait for the PONG: everything written before has been processed by the server."""
        self._pong.clear()
        self.writer.write(b"PING\r\n")
        await self.writer.drain()
        await asyncio.wait_for(self._pong.wait(), timeout_s)

    async def drain(self) -> None:
        await self.writer.drain()

    async def _read_loop(self) -> None:
        try:
            await self._read()
        except Exception as e:  # noqa: BLE001 — surfaced by check() and close()
            self.error = e
            raise

    def check(self) -> None:
        if self.error is not None:
            raise ConnectionError(f"NATS read loop failed: {self.error!r}") from self.error

    async def _read(self) -> None:
        buf = self._buf
        while True:
            pos, n = 0, len(buf)
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    break
                op = buf[pos:pos + 4]
                if op == b"MSG " or op == b"HMSG":
                    args = bytes(buf[pos:eol]).split()
                    if op == b"MSG ":
                        size, hsize = int(args[-1]), 0
                    else:
                        size, hsize = int(args[-1]), int(args[-2])
                    end = eol + 2 + size + 2
                    if end > n:
                        break
                    reply = args[3] if len(args) == (5 if op == b"MSG " else 6) else b""
                    status = None
                    if hsize:
                        status = bytes(buf[eol + 2 + 9:eol + 2 + 12]) if buf[eol + 2 + 8] == 0x20 else None
                    self.on_msg(int(args[2]), reply, buf[eol + 2 + hsize:end - 2], status)
                    pos = end
                    continue
                if op == b"PING":
                    self.writer.write(b"PONG\r\n")
                elif op == b"PONG":
                    self._pong.set()
                elif op == b"-ERR":
                    raise ConnectionError(bytes(buf[pos:eol]).decode(errors="replace"))
                pos = eol + 2
            if pos:
                del buf[:pos]
            data = await self.reader.read(1 << 20)
            if not data:
                return
            buf += data

    async def close(self) -> None:
        self.check()
        if self._task:
            self._task.cancel()
        self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass
