"""Generated events into a JetStream stream, for queries that read their events from
JetStream (``--jetstream STREAM``).

Stream ``STREAM`` holds subjects ``STREAM.<kind>.<partition>``: event n goes to partition
``epoch(n) % partitions`` of its kind, so a query reads each kind with up to
``partitions`` tasks, each partition in event-number order. A message is the event's JSON
line (as in an events file) with the ``Nats-Msg-Id`` ``nexmark/<seed>/<n>``: publishing
the same events again within the stream's duplicate window stores nothing twice.
"""

from __future__ import annotations

import json

from gearbus.connectors.jetstream import Publisher, ensure_stream_async, on_connection
from gearbus.nexmark.generator import Generator, GeneratorConfig
from gearbus.nexmark.schema import kind_of

DEFAULT_PARTITIONS = 4
PUBLISH_CHUNK_EVENTS = 10_000
DUPLICATE_WINDOW_S = 120.0


def subjects(stream: str, kind: str) -> str:
    """The subjects of ``kind`` in ``stream`` (a wildcard)."""
    return f"{stream}.{kind}.*"


def publish_events(servers: str | list[str], stream: str, events: int, config: GeneratorConfig = GeneratorConfig(),
                   partitions: int = DEFAULT_PARTITIONS, creds: str | None = None) -> tuple[int, int]:
    """Create ``stream`` if it is missing and publish events 0 .. ``events`` - 1 into it,
    acknowledged; (stored, duplicates)."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    generator = Generator(config)

    async def publish(nc) -> tuple[int, int]:
        await ensure_stream_async(nc, stream, [f"{stream}.>"], DUPLICATE_WINDOW_S, "file")
        publisher = await Publisher(nc).open()
        for start in range(0, events, PUBLISH_CHUNK_EVENTS):
            for n, event in enumerate(generator.events(start, min(start + PUBLISH_CHUNK_EVENTS, events)), start):
                partition = n // config.epoch_events % partitions
                await publisher.publish(f"{stream}.{kind_of(event)}.{partition}",
                                        json.dumps(event, separators=(",", ":")).encode(),
                                        f"nexmark/{config.seed}/{n}")
        await publisher.drain()
        return publisher.published, publisher.duplicates

    return on_connection(servers, publish, creds, name="gearbus-nexmark-publish")
