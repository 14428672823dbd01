"""The gate a cluster delivery waits in before its messages go out (pigeon.node.streams.Gate): open once its
Deliver record is held by Qa members and every publisher of its messages is answered — never before — and the
stream waiting on it is woken in the step that lets the last part in (an answer), or in the record's own done
callback: one turn of the event loop, where the futures it replaced (a shield, a gather, the wake-up as their
callback) took three or four, each as long as a busy owner's longest callback."""

from __future__ import annotations

import asyncio

import pytest

from pigeon.core.errors import Unavailable
from pigeon.node.streams import Gate


def run(coro):
    return asyncio.run(coro)


def _armed(answers: int = 1) -> tuple[asyncio.Future, Gate, list]:
    """A gate waiting for a record (the future returned) and `answers` answers, armed; what its wake-up saw."""
    record, gate, woken = asyncio.get_running_loop().create_future(), Gate(), []
    for _ in range(answers):
        gate.wait_answer()
    gate.wait_future(record)
    gate.wakes.append(lambda: woken.append(gate.fut.done()))
    gate.arm()
    return record, gate, woken


def test_opens_only_once_every_part_is_in_and_wakes_in_that_step():
    async def go():
        record, gate, woken = _armed(answers=2)
        gate.answer_in()
        record.set_result(7)
        await asyncio.sleep(0)  # (the record's done callback runs)
        assert not gate.fut.done() and not woken, "one publisher is not answered yet"
        gate.answer_in()
        assert woken == [True], "woken in the very call that let the last part in, the gate already open"
        assert gate.fut.result() is None

    run(go())


def test_the_record_confirmed_last_wakes_the_stream_in_its_done_callback():
    async def go():
        record, gate, woken = _armed()
        gate.answer_in()
        assert not woken
        record.set_result(3)
        await asyncio.sleep(0)
        assert woken == [True] and gate.fut.done()

    run(go())


def test_an_armed_gate_with_nothing_left_is_open_at_once_and_none_opens_before_it_is_armed():
    async def go():
        gate, woken = Gate(), []
        gate.wait_answer()
        gate.answer_in()
        assert not gate.fut.done(), "parts may still be added until it is armed"
        gate.wakes.append(lambda: woken.append(True))
        gate.arm()
        assert gate.fut.done() and woken == [True]

    run(go())


def test_a_record_that_fails_fails_the_gate_and_still_wakes_the_stream():
    async def go():
        record, gate, woken = _armed()
        record.set_exception(Unavailable("the bundle moved"))
        await asyncio.sleep(0)
        assert woken == [True]
        with pytest.raises(Unavailable):
            gate.fut.result()
        gate.answer_in()  # (an answer after the failure changes nothing)
        assert woken == [True]

    run(go())


def test_a_cancelled_record_cancels_the_gate():
    async def go():
        loop = asyncio.get_running_loop()
        record, gate = loop.create_future(), Gate()
        gate.wait_future(record)
        gate.arm()
        record.cancel()
        await asyncio.sleep(0)
        assert gate.fut.cancelled()

    run(go())
