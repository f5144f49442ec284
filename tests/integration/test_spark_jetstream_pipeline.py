"""One JetStream pipeline on the bus (TestRunner) and on the SparkRunner, against one
real nats-server: a replay of the same stream range gives the same output, a rerun of
the Spark job stores nothing twice, and what a replay cannot do is refused by name."""

from __future__ import annotations

import collections
import datetime
import json
import random
import uuid

import pytest

from gearbus import Pipeline, TumblingWindows
from gearbus.api.graph import GraphError
from gearbus.connectors.jetstream import connect, ensure_stream, run_fresh, stream_state
from gearbus.natsserver import NatsServer
from gearbus.security import add_user, init
from gearbus.runners import TestRunner
from gearbus.runners.spark import SparkRunner
from shared.messages import AppState
from tests.support.jetstream import publish
from tests.support.spark import shared_spark

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000
WINDOW_MS = 1_000
DELAY_MS = 200
BAD = b"not json {"


@pytest.fixture(scope="module")
def spark():
    return shared_spark()


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with NatsServer(store_dir=str(tmp_path_factory.mktemp("jetstream"))) as s:
        yield s


def names(prefix: str) -> tuple[str, str]:
    """A fresh (stream, subject prefix) pair."""
    tag = uuid.uuid4().hex[:8]
    return f"{prefix}_{tag}".upper(), f"{prefix}.{tag}"


def stored(url: str, stream: str) -> list[tuple[dict, bytes]]:
    """Every message in a stream: (headers, payload)."""

    async def go():
        nc = await connect([url], name="test-read")
        try:
            jsm = nc.jsm()
            info = await jsm.stream_info(stream)
            return [await jsm.get_msg(stream, seq) for seq in range(info.state.first_seq, info.state.last_seq + 1)]
        finally:
            await nc.close()

    return [(m.headers or {}, m.data) for m in run_fresh(go())]


def values(url: str, stream: str) -> collections.Counter:
    return collections.Counter(json.dumps(json.loads(data), sort_keys=True) for _, data in stored(url, stream))


def events(n: int) -> list[tuple[str, dict | bytes]]:
    """Three subjects far apart in event time, interleaved in the stream, each out of order
    by less than DELAY_MS; every 250th message on ev.b does not decode."""
    rng = random.Random(11)
    clocks = {"a": 0, "b": 40_000, "c": 90_000}
    out: list[tuple[str, dict | bytes]] = []
    for i in range(n):
        if i % 250 == 249:
            out.append(("b", BAD))
            continue
        subject = rng.choice("abc")
        clocks[subject] += rng.randrange(0, 40)
        out.append((subject, {"user": rng.choice(["u0", "u1", "u2"]),
                              "ts": T0 + clocks[subject] - rng.randrange(0, DELAY_MS)}))
    return out


def window_counts(stream: str, subjects: str, subject: str, out_stream: str, dead_letter: str,
                  servers: str | None, until="now") -> Pipeline:
    p = Pipeline("ev-counts", config={"batch_records": 100}, parallelism=2)
    (p.read_jetstream(stream, f"{subjects}.*", until=until, timestamp_fn=lambda v: v["ts"],
                      max_out_of_orderness_ms=DELAY_MS, servers=servers, dead_letter=dead_letter, name="events")
      .group_by(lambda v: v["user"], name="by_user")
      .window(TumblingWindows(WINDOW_MS)).count(name="count")
      .map(lambda r: {"window_start": r.window_start, "count": r.value}, name="row")
      .write_jetstream(subject, stream=out_stream, servers=servers, name="out"))
    return p


def test_windowed_counts_replayed_on_spark_equal_the_bus_and_a_rerun_stores_nothing_twice(spark, server,
                                                                                          monkeypatch):
    url = server.url
    stream, subjects = names("ev")
    dead_stream, dead_letter = names("dead")
    ensure_stream(url, stream, [f"{subjects}.*"])
    ensure_stream(url, dead_stream, [dead_letter])
    input_events = events(3000)
    publish(url, [(f"{subjects}.{s}", v if isinstance(v, bytes) else json.dumps(v).encode())
                  for s, v in input_events])
    per_window = collections.Counter((v["user"], v["ts"] - v["ts"] % WINDOW_MS)
                                     for _, v in input_events if not isinstance(v, bytes))
    expected = collections.Counter(json.dumps({"window_start": start, "count": n}, sort_keys=True)
                                   for (_, start), n in per_window.items())
    assert max(expected.values()) > 1  # equal values among the output: none may pass for a repeat
    bad = sum(1 for _, v in input_events if v == BAD)

    out_spark, out_bus = names("spark_out"), names("bus_out")
    spark_pipeline = window_counts(stream, subjects, out_spark[1], out_spark[0], dead_letter, url)
    result = SparkRunner(spark=spark).run(spark_pipeline)
    assert result.state == AppState.SUCCEEDED, result.error
    assert values(url, out_spark[0]) == expected
    dead = stored(url, dead_stream)
    assert [data for _, data in dead] == [BAD] * bad
    assert all(h["Gearbus-Source"].startswith(f"{stream}/") and h["Gearbus-Error"] for h, _ in dead)

    monkeypatch.setenv("GEARBUS_NATS_URL", url)  # the same job again, its NATS from the environment
    again = window_counts(stream, subjects, out_spark[1], out_spark[0], dead_letter, None)
    assert SparkRunner(spark=spark).run(again).state == AppState.SUCCEEDED
    assert stream_state(url, out_spark[0])["messages"] == sum(expected.values())
    assert stream_state(url, dead_stream)["messages"] == bad

    TestRunner().run(window_counts(stream, subjects, out_bus[1], out_bus[0], dead_letter, url))
    assert values(url, out_bus[0]) == values(url, out_spark[0]) == expected
    assert stream_state(url, dead_stream)["messages"] == bad  # the bus's dead letters have the same ids


def test_a_range_from_a_datetime_to_a_sequence_with_subject_filters_and_id_fn(spark, server):
    url = server.url
    stream, subjects = names("range")
    ensure_stream(url, stream, [f"{subjects}.*"])
    first = [(f"{subjects}.{'abc'[i % 3]}", f"old-{i}") for i in range(300)]
    publish(url, [(s, json.dumps(v).encode()) for s, v in first])
    when = datetime.datetime.now(datetime.timezone.utc)
    second = [(f"{subjects}.{'abc'[i % 3]}", f"new-{i}") for i in range(300)]
    publish(url, [(s, json.dumps(v).encode()) for s, v in second])
    until = len(first) + 200  # the stream's sequence of second[199]
    expected = sorted(v for s, v in second[:200] if not s.endswith(".b"))

    def copy(out: tuple[str, str], servers: str | None) -> Pipeline:
        p = Pipeline("copy")
        (p.read_jetstream(stream, [f"{subjects}.a", f"{subjects}.c"], start=when, until=until, servers=servers,
                          name="events")
          .map(str.upper, name="upper")
          .write_jetstream(out[1], stream=out[0], id_fn=lambda v: v, servers=servers, name="out"))
        return p

    out_spark, out_bus = names("copy_spark"), names("copy_bus")
    result = SparkRunner(spark=spark, nats_url=url).run(copy(out_spark, None))
    assert result.state == AppState.SUCCEEDED, result.error
    TestRunner().run(copy(out_bus, url))
    for out in (out_spark, out_bus):
        messages = stored(url, out[0])
        assert sorted(json.loads(data) for _, data in messages) == [v.upper() for v in expected]
        assert {h["Nats-Msg-Id"] for h, _ in messages} == {v.upper() for v in expected}


def test_an_endless_or_unbounded_replay_is_refused_naming_the_step(spark, server, monkeypatch):
    def pipeline(**kwargs) -> Pipeline:
        p = Pipeline("refused")
        p.read_jetstream("EV", name="events", **kwargs).write_jetstream("out.x")
        return p

    runner = SparkRunner(spark=spark, nats_url=server.url)
    with pytest.raises(GraphError, match=r"step 'events': the Spark runner replays bounded history; give until="):
        runner.run(pipeline())
    with pytest.raises(GraphError, match=r"step 'events': start=\"new\" reads only what arrives after the start"):
        runner.run(pipeline(start="new", until="now"))
    monkeypatch.delenv("GEARBUS_NATS_URL", raising=False)
    with pytest.raises(GraphError, match=r"step 'events': no NATS servers; pass servers=\.\.\."):
        SparkRunner(spark=spark).run(pipeline(until="now"))


def test_a_missing_stream_or_an_until_past_the_end_fails_the_run_clearly(spark, server):
    url = server.url
    stream, subjects = names("short")
    ensure_stream(url, stream, [f"{subjects}.*"])
    publish(url, [(f"{subjects}.a", b"1")] * 5)

    def run(stream_name: str, until):
        p = Pipeline("short")
        p.read_jetstream(stream_name, until=until, servers=url, name="events").write_jetstream("out.short")
        return SparkRunner(spark=spark).run(p)

    missing = run("NO_SUCH_STREAM", "now")
    assert missing.state == AppState.FAILED
    assert "step 'events': JetStream stream 'NO_SUCH_STREAM' does not exist" in missing.error.message
    future = run(stream, 9)
    assert future.state == AppState.FAILED
    assert f"until=9 is past the end of stream {stream!r} (sequence 5)" in future.error.message


def test_on_a_secure_nats_the_steps_read_and_write_with_their_own_credential(spark, tmp_path):
    """A data user from `gearbus security user` reads one stream and writes another, in the
    driver's planning and in the executors; without it the run fails saying why."""
    made = init(str(tmp_path / "security"))
    creds = add_user(made.path, "events", streams=["SECURE_IN", "SECURE_OUT"], publish=["secure.>"])
    with NatsServer(include=made.auth_config) as secure:
        ensure_stream(secure.url, "SECURE_IN", ["secure.in"], creds=creds)

        async def fill():
            nc = await connect([secure.url], creds=creds)
            try:
                for n in range(300):
                    await nc.jetstream().publish("secure.in", json.dumps(n).encode())
            finally:
                await nc.close()

        run_fresh(fill())

        def copy(with_creds: str | None) -> Pipeline:
            p = Pipeline("secure")
            (p.read_jetstream("SECURE_IN", until="now", creds=with_creds, name="events")
              .map(lambda n: n * 2, name="double")
              .write_jetstream("secure.out", stream="SECURE_OUT", creds=with_creds, name="out"))
            return p

        result = SparkRunner(spark=spark, nats_url=secure.url).run(copy(creds))
        assert result.state == AppState.SUCCEEDED, result.error
        assert stream_state(secure.url, "SECURE_OUT", creds)["messages"] == 300
        refused = SparkRunner(spark=spark, nats_url=secure.url).run(copy(None))
    assert refused.state == AppState.FAILED and "refused no credential" in refused.error.message
