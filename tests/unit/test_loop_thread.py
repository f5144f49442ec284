"""LoopThread: no caller of a connector's loop waits for good (a close that hangs after a
NATS server restart once froze an executor's task loop)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from shared.loop_thread import LoopThread


async def forever():
    await asyncio.Event().wait()


async def answer():
    return 42


def test_a_call_returns_the_coroutines_result():
    thread = LoopThread("t")
    try:
        assert thread.call(answer()) == 42
    finally:
        thread.stop()


def test_a_call_past_its_timeout_fails_and_cancels_the_coroutine():
    thread = LoopThread("t")
    cancelled = threading.Event()

    async def hangs():
        try:
            await forever()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    try:
        with pytest.raises(TimeoutError, match="t: not done within 0.1 s"):
            thread.call(hangs(), timeout=0.1)
        assert cancelled.wait(5)
    finally:
        thread.stop()


def test_stop_releases_a_caller_blocked_on_another_thread():
    thread = LoopThread("sink")
    outcome = []
    started = threading.Event()

    async def blocks():
        started.set()
        await forever()

    def caller():
        try:
            thread.call(blocks())
        except RuntimeError as exc:
            outcome.append(str(exc))

    waiting = threading.Thread(target=caller)
    waiting.start()
    assert started.wait(5)
    thread.stop()
    waiting.join(5)
    assert not waiting.is_alive() and outcome == ["sink was stopped while a call ran"]


def test_a_call_after_stop_fails_at_once():
    thread = LoopThread("t")
    thread.stop()
    with pytest.raises(RuntimeError, match="t is stopped"):
        thread.call(answer(), timeout=1)


def test_stop_gives_a_hanging_close_its_time_and_reports_it():
    thread = LoopThread("t")
    failure = thread.stop(forever(), timeout=0.1)
    assert isinstance(failure, TimeoutError)
    assert not thread.thread.is_alive()
    assert thread.stop() is None


def test_stop_reports_what_the_close_raised():
    async def fails():
        raise ConnectionError("gone")

    failure = LoopThread("t").stop(fails())
    assert isinstance(failure, ConnectionError)
