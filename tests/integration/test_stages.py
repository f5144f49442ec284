"""Multi-stage apps on a real cluster (Samza's intermediate streams): each stage runs as an
app of its own over a JetStream stream the app owns; the output is exact; a killed
executor of the downstream stage recovers that stage alone while the upstream one goes on
checkpointing; the streams go when the app ends, and stay when it fails."""

from __future__ import annotations

import collections
import json
import os
import signal
import textwrap
import threading

import pytest

from gearbus.api.graph import GraphError, Processor
from gearbus.api.partitioners import IntermediateStream
from gearbus.api.task import Record, TaskContext
from gearbus.artifact import pack
from gearbus.cli import format_status
from gearbus.connectors import intermediate
from gearbus.connectors.intermediate import FULL_WAIT_S, PLACE, StreamWriter, decode
from gearbus.connectors.jetstream import api, ensure_stream, on_connection, publish_messages, stream_state
from gearbus.runners import prepare
from shared import subjects
from shared.messages import AppState, IntermediateStreamSpec
from tests.support.cluster import wait_state, wait_until

STAGED = """
    from gearbus import Pipeline, TumblingWindows
    from gearbus.connectors.generator import RateSource


    def key(word):
        if word == "{poison}":
            raise ValueError("a poisoned word")
        return word


    def application(args):
        p = Pipeline("{name}", parallelism=2, config={{"checkpoint_interval_ms": 200}})
        (p.source(RateSource(rate={rate}, count={count}), parallelism=2, name="numbers", timestamp_fn=lambda n: n)
            .map(lambda n: f"w{{n % 37}}", name="word")
            .repartition(key, via="jetstream", name="by_word")
            .window(TumblingWindows(1000)).count(name="count")
            .map(list, name="row")
            .write_jsonl(args[0], name="out"))
        return p
"""


@pytest.fixture(scope="module")
def cluster(shared_cluster):
    """One cluster for the file (its apps and streams have names of their own), whose apps
    start right after others end."""
    return shared_cluster


@pytest.fixture
def client(shared_client):
    return shared_client


def staged_app(tmp_path, name: str, rate: int, count: int, poison: str = "") -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(STAGED.format(name=name, rate=rate, count=count, poison=poison)))
    return str(path)


def expected(count: int) -> dict:
    counts = collections.Counter((f"w{n % 37}", n // 1000) for n in range(count))
    return dict(counts)


def written(path) -> dict:
    rows = [json.loads(line) for line in open(path)]
    found = {(word, start // 1000): n for word, n, start, _, _ in rows}
    assert len(found) == len(rows), "a window was written twice"
    return found


def stream_exists(url: str, name: str) -> bool:
    async def look(nc):
        return await intermediate.existing(nc, name) is not None

    return on_connection([url], look)


def stored_messages(url: str, stream: str) -> list[bytes]:
    async def read(nc):
        jsm = nc.jsm()
        state = (await jsm.stream_info(stream)).state
        return [(await jsm.get_msg(stream, seq)).data for seq in range(state.first_seq, state.last_seq + 1)]

    return on_connection([url], read)


def executors_of(cluster, app_id: int) -> list[int]:
    """The pids of an app's executors, as the workers launched them."""
    return [pid for (app, executor_id), pid in cluster.launches().items() if app == app_id and executor_id >= 0]


async def test_a_two_stage_app_is_exact_and_its_streams_go_with_it(cluster, client, tmp_path):
    out = tmp_path / "counts.jsonl"
    app_id = await client.submit(pack(staged_app(tmp_path, "twostage", 5000, 20_000)), [str(out)])
    await wait_state(client, app_id, AppState.ACTIVE)
    status = await client.status(app_id)
    assert len(status.stage_apps) == 2
    (stream,) = status.streams
    assert (stream.name, stream.partitions, stream.from_stage, stream.to_stage) == ("gearbus_twostage_by_word", 2, 0, 1)
    assert stream.messages >= 0
    assert "stream gearbus_twostage_by_word (stage 0 -> 1, 2 partitions): backlog" in format_status(status)
    stages = [await client.status(i) for i in status.stage_apps]
    assert [(s.stage_of, s.stage, s.name) for s in stages] == [(app_id, 0, "twostage.stage0"),
                                                               (app_id, 1, "twostage.stage1")]
    final = await client.wait(app_id, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert written(out) == expected(20_000)
    assert {(await client.status(i)).state for i in status.stage_apps} == {AppState.SUCCEEDED}
    assert not stream_exists(cluster.url, "gearbus_twostage_by_word")


@pytest.mark.chaos
async def test_a_killed_downstream_executor_recovers_its_stage_alone_while_upstream_checkpoints_go_on(
        cluster, client, tmp_path):
    out = tmp_path / "counts.jsonl"
    app_id = await client.submit(pack(staged_app(tmp_path, "killed", 3000, 90_000)), [str(out)])
    await wait_state(client, app_id, AppState.ACTIVE)
    upstream, downstream = (await client.status(app_id)).stage_apps

    async def checkpointed(app: int, at_least: int):
        async def probe():
            status = await client.status(app)
            assert status.state not in AppState.TERMINAL, f"app {app} ended early: {status.state} {status.error}"
            done = status.checkpoints.completed if status.checkpoints else 0
            return status if done >= at_least else None
        return await wait_until(client, subjects.checkpoint_complete(app), probe, timeout=60)

    await checkpointed(downstream, 2)
    before = (await checkpointed(upstream, 1)).checkpoints.completed  # (it still runs)
    for pid in executors_of(cluster, downstream):
        os.kill(pid, signal.SIGKILL)

    async def recovered():
        status = await client.status(downstream)
        return status if status.restarts >= 1 and status.checkpoints.epoch >= 1 and \
            status.checkpoints.last_id > 0 and status.checkpoints.completed > 0 else None
    recovery = await wait_until(client, subjects.checkpoint_complete(downstream), recovered, timeout=60)
    meanwhile = await client.status(upstream)
    assert meanwhile.restarts == 0 and meanwhile.checkpoints.epoch == 0
    assert meanwhile.checkpoints.completed >= before + 2, "the upstream stage stopped checkpointing"
    assert recovery.restarts >= 1
    final = await client.wait(app_id, timeout=120)
    assert final.state == AppState.SUCCEEDED, final.error
    assert written(out) == expected(90_000)


def test_a_writer_of_a_full_stream_waits_for_the_reader_and_then_publishes_in_order(cluster):
    url = cluster.url
    stream = IntermediateStream("by_word", 1, "gearbus_full_by_word")
    on_connection([url], lambda nc: intermediate.create_streams(
        nc, [IntermediateStreamSpec(stream.stream, 1, "by_word", 0, 1)], "full"))
    publish_messages(url, "gearbus_full_by_word.0", [b"x" * 4096] * 4)  # what the reader has not read yet
    writer = StreamWriter(stream, max_bytes=8192)
    writer.open(TaskContext(1, "full", Processor.sink(writer, name="w"), 0, 0, nats_servers=[url]))
    try:
        writer.write([Record(f"w{n}", n, f"w{n}") for n in range(10)])
        writer.on_watermark(9)
        writer.pre_commit(1)
        committing = threading.Thread(target=writer.commit, args=(1,))
        committing.start()
        committing.join(2 * FULL_WAIT_S)
        assert committing.is_alive(), "the writer published into a full stream"
        assert stream_state(url, stream.stream)["messages"] == 4
        on_connection([url], lambda nc: api(nc, f"$JS.API.STREAM.PURGE.{stream.stream}", {}))  # the reader read
        committing.join(10)
        assert not committing.is_alive()
    finally:
        writer.close()
    (message,) = stored_messages(url, stream.stream)
    assert PLACE.unpack_from(message) == (1, 0)
    assert decode(message[PLACE.size:]) == (0, 1, 9, [Record(f"w{n}", n, f"w{n}") for n in range(10)])


async def test_a_bounded_stream_holds_the_upstream_stage_back_and_loses_nothing(cluster, client, tmp_path):
    """A stream bounded far below what goes through it (its writers wait, as above): the
    output is still exact."""
    out = tmp_path / "counts.jsonl"
    app_id = await client.submit(pack(staged_app(tmp_path, "bounded", 20_000, 30_000)), [str(out)],
                                 config={"intermediate_stream_max_bytes": 16_384})
    final = await client.wait(app_id, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert written(out) == expected(30_000)


async def test_a_failing_stage_fails_the_app_naming_the_step_and_keeps_the_stream(cluster, client, tmp_path):
    out = tmp_path / "counts.jsonl"
    app_id = await client.submit(pack(staged_app(tmp_path, "poisoned", 5000, 10_000, poison="w5")), [str(out)])
    final = await client.wait(app_id, timeout=90)
    assert final.state == AppState.FAILED
    assert final.error.error_type == "ValueError"
    assert "stage 0" in final.error.message and "step 'by_word'" in final.error.message
    assert "'w5'" in final.error.message and "a poisoned word" in final.error.message
    upstream, downstream = final.stage_apps
    assert (await client.status(upstream)).state == AppState.FAILED
    assert (await client.status(downstream)).state == AppState.TERMINATED
    assert stream_exists(cluster.url, "gearbus_poisoned_by_word")


async def test_a_stream_name_that_belongs_to_something_else_is_refused(cluster, client, tmp_path):
    path = staged_app(tmp_path, "taken", 5000, 1_000)
    ensure_stream(cluster.url, "gearbus_taken_by_word", ["elsewhere.>"])
    with pytest.raises(GraphError, match="step 'by_word'.*gearbus_taken_by_word.*belongs to something else"):
        prepare(path, [str(tmp_path / "out")], "cluster", cluster.url)
    # a client that does not check first: the app fails before any stage starts
    app_id = await client.submit(pack(path), [str(tmp_path / "out")])
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.FAILED and final.stage_apps == []
    assert "gearbus_taken_by_word" in final.error.message and "belongs to something else" in final.error.message
    assert stream_exists(cluster.url, "gearbus_taken_by_word")


async def test_killing_the_app_kills_its_stages_and_deletes_its_streams(cluster, client, tmp_path):
    app_id = await client.submit(pack(staged_app(tmp_path, "endless", 500, 10**9)), [str(tmp_path / "out")])
    await wait_state(client, app_id, AppState.ACTIVE)
    stage_apps = (await client.status(app_id)).stage_apps
    for stage in stage_apps:
        await wait_state(client, stage, AppState.ACTIVE)
    await client.kill(app_id)
    for stage in stage_apps:
        final = await client.wait(stage, timeout=30)
        assert final.state == AppState.TERMINATED
    assert not stream_exists(cluster.url, "gearbus_endless_by_word")
