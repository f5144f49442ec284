"""shared.bus.object_bytes against a real nats-server's object store: objects of one chunk,
of many (the last one short, more than one fetch takes), empty, and missing."""

from __future__ import annotations

import os
from types import SimpleNamespace

import nats
import nats.js.errors
import pytest

from nats.js import api

from shared.bus import object_bytes, object_chunk_bytes

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
        big = os.urandom(3 * (1 << 20) + 7)  # chunks of 1 MiB, as object_chunk_bytes makes them
        await store.put("big", big, meta=api.ObjectMeta(name="big", options=api.ObjectMetaOptions(max_chunk_size=1 << 20)))
        assert await object_bytes(js, "objects", "big") == big
        with pytest.raises(nats.js.errors.ObjectNotFoundError):
            await object_bytes(js, "objects", "missing")
    finally:
        await nc.close()


def test_objects_are_written_in_chunks_as_large_as_a_message_may_be_up_to_8_mib():
    assert [object_chunk_bytes(SimpleNamespace(max_payload=size)) for size in (64 << 10, 1 << 20, 64 << 20)] == \
        [CHUNK, 1 << 20, 8 << 20]
