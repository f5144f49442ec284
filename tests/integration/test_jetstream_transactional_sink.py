"""JetStreamTransactionalSink against a real nats-server: output becomes visible only
when its checkpoint commits, exactly once however often a commit is repeated; and a
pipeline from one stream to another through the in-process engine, crash included."""

from __future__ import annotations

import json

import pytest

from gearbus import Pipeline
from gearbus.api.graph import Processor
from gearbus.api.task import Record, TaskContext
from gearbus.connectors.jetstream import JetStreamTransactionalSink, connect, ensure_stream, run_fresh, stream_state
from gearbus.planner import plan
from gearbus.runners import TestRunner
from gearbus.runners.inprocess import InProcessEngine, SimulatedCrash
from tests.support.jetstream import fill


def opened(url: str, sink: JetStreamTransactionalSink, epoch: int = 0) -> JetStreamTransactionalSink:
    sink.open(TaskContext(1, "app", Processor.sink(sink, name="out"), 0, 0, epoch=epoch, nats_servers=[url]))
    return sink


def records(start: int, stop: int) -> list[Record]:
    return [Record({"n": n}, 0) for n in range(start, stop)]


def stored(url: str, stream: str = "OUT") -> list[tuple[str, dict]]:
    """Every message in the stream: (Nats-Msg-Id, value)."""

    async def go():
        nc = await connect([url], name="test")
        try:
            jsm = nc.jsm()
            last = (await jsm.stream_info(stream)).state.last_seq
            return [await jsm.get_msg(stream, seq) for seq in range(1, last + 1)]
        finally:
            await nc.close()

    return [(m.headers["Nats-Msg-Id"], json.loads(m.data)) for m in run_fresh(go())]


def test_output_is_published_at_commit_and_only_once(nats_server):
    url = nats_server.url
    sink = opened(url, JetStreamTransactionalSink("out.x", stream="OUT"))
    try:
        sink.write(records(0, 100))
        sink.pre_commit(1)
        sink.write(records(100, 150))  # after barrier 1: checkpoint 2's
        assert stream_state(url, "OUT")["messages"] == 0
        sink.commit(1)
        sink.commit(1)  # repeated: nothing new
        assert stored(url) == [(f"1.0/out/0/0/1/{i}", {"n": i}) for i in range(100)]
        sink.pre_commit(2)
        sink.pre_commit(3)  # nothing written since: no transaction
        assert sink.snapshot() == [("1.0/out/0/0/2", 2, [b'{"n":%d}' % n for n in range(100, 150)], None)]
        sink.commit(3)
        assert [value["n"] for _, value in stored(url)] == list(range(150))
        assert sink.snapshot() == []
    finally:
        sink.close()


def test_a_restored_sink_commits_its_checkpoint_again_without_duplicates(nats_server):
    url = nats_server.url
    ensure_stream(url, "OUT", ["out.x"])
    first = opened(url, JetStreamTransactionalSink("out.x"))
    first.write(records(0, 100))
    first.pre_commit(1)
    state = first.snapshot()
    first.commit(1)  # committed, then the crash: the checkpoint's commit is repeated on restore
    first.write(records(100, 130))
    first.pre_commit(2)  # checkpoint 2 never completes
    first.close()
    for _ in range(2):  # restored twice (a second crash during recovery)
        second = opened(url, JetStreamTransactionalSink("out.x"), epoch=1)
        second.restore(state)
        assert stream_state(url, "OUT")["messages"] == 100
        assert second.snapshot() == []
    try:
        second.write(records(100, 130))  # replayed after checkpoint 1, in the new epoch
        second.pre_commit(2)
        second.commit(2)
    finally:
        second.close()
    messages = stored(url)
    assert [value["n"] for _, value in messages] == list(range(130))
    assert messages[100][0] == "1.0/out/0/1/2/0"


def test_a_sink_restored_before_its_commit_publishes_the_checkpoint(nats_server):
    url = nats_server.url
    ensure_stream(url, "OUT", ["out.x"])
    first = opened(url, JetStreamTransactionalSink("out.x", id_fn=lambda v: v["n"] % 10))
    first.write(records(0, 20))  # ids from the data: 10 distinct
    first.pre_commit(7)
    state = first.snapshot()
    first.close()  # crashed before checkpoint 7's commit
    assert stream_state(url, "OUT")["messages"] == 0
    second = opened(url, JetStreamTransactionalSink("out.x", id_fn=lambda v: v["n"] % 10))
    try:
        second.restore(state)
    finally:
        second.close()
    assert stored(url) == [(str(n), {"n": n}) for n in range(10)]


def test_no_servers_is_a_clear_error():
    sink = JetStreamTransactionalSink("out.x")
    with pytest.raises(ValueError, match="no NATS servers"):
        sink.open(TaskContext(1, "app", Processor.sink(sink, name="out"), 0, 0))


def doubled(url: str, parallelism: int | None = None) -> Pipeline:
    """EV's events, doubled, into OUT; with a ``parallelism`` of its own the doubling
    (and the sink after it) is a second processor, fed by frames."""
    p = Pipeline("copy", parallelism=2)
    (p.read_jetstream("EV", until="now", servers=url)
      .map(lambda v: {"n": v["n"], "twice": 2 * v["n"]}, name="double", parallelism=parallelism)
      .write_jetstream("out.x", stream="OUT", servers=url))
    return p


def test_a_pipeline_copies_a_stream_into_another_exactly(nats_server):
    url = nats_server.url
    fill(url, 2000)
    TestRunner().run(doubled(url))
    messages = stored(url)
    assert sorted(value["n"] for _, value in messages) == list(range(2000))
    assert all(value["twice"] == 2 * value["n"] for _, value in messages)
    assert {msg_id.rsplit("/", 3)[0] for msg_id, _ in messages} == {"0.0/write_jetstream/0",
                                                                    "0.0/write_jetstream/1"}


def test_a_pipeline_that_crashes_recovers_without_loss_or_duplicates(nats_server):
    url = nats_server.url
    fill(url, 5000)
    # Barriers and watermarks are frames too: on a loaded machine the source's first reads
    # from JetStream come late, and 30 frames may all pass before any record commits. A
    # crash that committed nothing leaves nothing behind, so crash later until one did.
    for crash_after in (30, 60, 120, 240):
        first = InProcessEngine(plan(doubled(url, 3), "test"), batch_records=250, checkpoint_every=4)
        with pytest.raises(SimulatedCrash):
            first.run(crash_after_frames=crash_after)
        if stored(url):
            break
    checkpoint = first.latest_checkpoint()
    assert checkpoint is not None
    committed = len(stored(url))
    assert 0 < committed < 5000
    second = InProcessEngine(plan(doubled(url, 3), "test"), batch_records=250, checkpoint_every=4, epoch=1)
    second.run(restore=checkpoint)
    assert sorted(value["n"] for _, value in stored(url)) == list(range(5000))
