"""shared.bus.object_bytes against a real nats-server's object store: objects of one chunk,
of many (the last one short, more than one fetch takes), empty, and missing."""

from __future__ import annotations

import os

import nats
import nats.js.errors
import pytest

from shared.bus import object_bytes

CHUNK = 128 * 1024  # nats-py's default chunk size


@pytest.mark.timeout(60)
async def test_an_object_reads_back_whole_whatever_its_chunks(nats_server):
    nc = await nats.connect(nats_server.url)
    try:
        js = nc.jetstream()
        store = await js.create_object_store("objects")
        for size in (0, 1, CHUNK, 5 * CHUNK + 17, 70 * CHUNK + 5):  # the last takes two fetches
            data = os.urandom(size)
            await store.put(f"size-{size}", data)
            assert await object_bytes(js, "objects", f"size-{size}") == data
        with pytest.raises(nats.js.errors.ObjectNotFoundError):
            await object_bytes(js, "objects", "missing")
    finally:
        await nc.close()
