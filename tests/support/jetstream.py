"""Filling JetStream streams for the tests of the readers and writers of JetStream."""

from __future__ import annotations

import json

from gearbus.connectors.jetstream import Publisher, connect, ensure_stream, run_fresh

EVENT_COUNT = 10_000  # what fill() publishes unless told


def publish(url: str, messages: list[tuple[str, bytes]]) -> None:
    """Publish (subject, data) pairs in this order, acknowledged."""

    async def go():
        nc = await connect([url], name="test")
        try:
            publisher = await Publisher(nc).open()
            for subject, data in messages:
                await publisher.publish(subject, data, None)
            await publisher.drain()
        finally:
            await nc.close()

    run_fresh(go())


def events(start: int, stop: int) -> list[tuple[str, bytes]]:
    """Event n goes to subject ev.(n % 4)."""
    return [(f"ev.{n % 4}", json.dumps({"n": n}).encode()) for n in range(start, stop)]


def fill(url: str, count: int = EVENT_COUNT) -> None:
    """Stream EV (subjects ev.*) holding events 0 .. count-1."""
    ensure_stream(url, "EV", ["ev.*"])
    publish(url, events(0, count))
