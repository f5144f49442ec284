"""NatsRequester against a real nats-server: answers to their own callers, no responders,
timeouts, a caller that gives up, and a requester shipped (pickled) to other event loops."""

from __future__ import annotations

import asyncio
import pickle

import nats
import pytest

from gearbus import NatsRequester, NoRespondersError


async def echo_service(url: str, subject: str, delays: dict[bytes, float] | None = None):
    """Answers ``subject`` with the payload reversed, after ``delays[payload]`` seconds
    (never, for None); its connection and how many requests it saw."""
    nc = await nats.connect(url)
    seen = []

    async def answer(msg) -> None:
        delay = (delays or {}).get(msg.data, 0.0)
        if delay is None:
            return
        await asyncio.sleep(delay)
        await msg.respond(msg.data[::-1])

    async def on_request(msg) -> None:
        seen.append(msg.data)
        asyncio.get_running_loop().create_task(answer(msg))

    await nc.subscribe(subject, cb=on_request)
    await nc.flush()
    return nc, seen


async def test_each_caller_gets_its_own_answer(nats_server):
    delays = {str(i).encode(): (i % 7) * 0.003 for i in range(300)}  # answers come out of order
    service, seen = await echo_service(nats_server.url, "echo", delays)
    requester = NatsRequester(nats_server.url, "echo")
    try:
        answers = await asyncio.gather(*(requester.request(str(i).encode()) for i in range(300)))
        assert answers == [str(i).encode()[::-1] for i in range(300)]
        assert len(seen) == 300
    finally:
        await service.close()


async def test_no_service_is_an_error_naming_the_subject(nats_server):
    with pytest.raises(NoRespondersError, match="'nobody.home'"):
        await NatsRequester(nats_server.url, "nobody.home").request(b"1")


async def test_a_silent_service_times_out_and_later_calls_still_work(nats_server):
    service, _ = await echo_service(nats_server.url, "echo", {b"silent": None})
    requester = NatsRequester(nats_server.url, "echo", timeout_s=0.2)
    try:
        with pytest.raises(TimeoutError, match="no answer on 'echo' within 0.2 s"):
            await requester.request(b"silent")
        assert await requester.request(b"ab") == b"ba"
    finally:
        await service.close()


async def test_a_caller_that_gives_up_does_not_disturb_the_others(nats_server):
    service, _ = await echo_service(nats_server.url, "echo", {b"slow": 0.3})
    requester = NatsRequester(nats_server.url, "echo")
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.05):  # as map_async's timeout_ms does
                await requester.request(b"slow")
        answers = await asyncio.gather(requester.request(b"slow"), requester.request(b"xy"))
        assert answers == [b"wols", b"yx"]
    finally:
        await service.close()


def test_a_pickled_requester_connects_again_on_each_event_loop(nats_server):
    async def serve_and_ask(requester: NatsRequester, payload: bytes) -> bytes:
        service, _ = await echo_service(nats_server.url, "echo")
        try:
            return await requester.request(payload)
        finally:
            await service.close()

    requester = NatsRequester(nats_server.url, "echo")
    assert asyncio.run(serve_and_ask(requester, b"one")) == b"eno"
    shipped = pickle.loads(pickle.dumps(requester))  # after use: no connection goes along
    assert asyncio.run(serve_and_ask(shipped, b"two")) == b"owt"
    assert asyncio.run(serve_and_ask(requester, b"three")) == b"eerht"  # a second loop of its own


def test_a_bad_subject_or_timeout_is_refused_when_built():
    with pytest.raises(ValueError, match="not a NATS subject"):
        NatsRequester("nats://127.0.0.1:4222", "two words")
    with pytest.raises(ValueError, match="timeout_s must be positive"):
        NatsRequester("nats://127.0.0.1:4222", "echo", timeout_s=0)
