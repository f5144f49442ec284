"""Joins and keyed state on the SparkRunner, held against the brute-force references and
against the TestRunner on the same data: window joins of every window kind and ``how``,
interval joins, as-of joins with tombstones and TTLs, latest-value joins in the order the
docs give, stateful_map and process_keyed with event-time timers and TTLs. Records are
out of order within the sources' bound, so none is late on either runner. What Spark
cannot run, and user code that fails, fail the run naming the step and the record."""

from __future__ import annotations

import json
import random
from collections import Counter

import pytest

from gearbus import KeyedProcessFunction, Pipeline, SessionWindows, SlidingWindows, TumblingWindows
from gearbus.api.watermarks import WATERMARK_MIN
from gearbus.connectors.jetstream import ensure_stream
from gearbus.runners import TestRunner
from gearbus.runners.spark import SparkRunner
from shared.messages import AppState
from tests.support.files import read_jsonl
from tests.support.jetstream import publish
from tests.support.joins import (
    Buckets,
    as_of_reference,
    buckets_reference,
    interval_reference,
    k,
    numbered,
    shuffled,
    t,
    window_reference,
)
from tests.support.spark import shared_spark

pytestmark = pytest.mark.spark

DELAY = 50  # the sources' max_out_of_orderness_ms
BATCH = 7  # records per source batch: the watermark moves often


@pytest.fixture(scope="module")
def spark():
    return shared_spark()


def drawn(n: int, seed: int, span: int = 3000) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    return [(rng.randrange(4), rng.randrange(span)) for _ in range(n)]


LEFT = numbered(drawn(240, 1), "l")
RIGHT = numbered(drawn(240, 2), "r")


def pipeline(left: list, right: list, build, path: str) -> Pipeline:
    """``build(a, b)`` over two sources, written to ``path``."""
    p = Pipeline("joins", parallelism=2, config={"batch_records": BATCH})
    a = p.from_collection(left, timestamp_fn=t, max_out_of_orderness_ms=DELAY, name="left")
    b = p.from_collection(right, timestamp_fn=t, max_out_of_orderness_ms=DELAY, name="right")
    build(a, b).write_jsonl(path, name="out")
    return p


def on_both(spark, tmp_path, make) -> tuple[list, list]:
    """``make(path)``'s rows on Spark and on the TestRunner."""
    result = SparkRunner(spark=spark).run(make(str(tmp_path / "spark")))
    assert result.state == AppState.SUCCEEDED, result.error
    TestRunner(seed=3).run(make(str(tmp_path / "bus.jsonl")))
    return read_jsonl(tmp_path / "spark"), read_jsonl(tmp_path / "bus.jsonl")


def stamp(pair, ctx) -> None:
    ctx.emit([pair.left and pair.left["id"], pair.right and pair.right["id"], ctx.timestamp, ctx.key])


def stamped(joined):
    """Each pair as [left id, right id, its timestamp, its key], through a keyed step."""
    return joined.group_by(lambda pair: (pair.left or pair.right)["k"], name="again").process_keyed(stamp, name="stamp")


def joined_on_both(spark, tmp_path, left, right, build) -> Counter:
    """The join's pairs, the same on Spark as on the TestRunner (times and keys too)."""
    on_spark, on_bus = on_both(spark, tmp_path, lambda path: pipeline(left, right, lambda a, b: stamped(build(a, b)),
                                                                     path))
    assert Counter(map(tuple, on_spark)) == Counter(map(tuple, on_bus))
    return Counter((left_id, right_id) for left_id, right_id, _, _ in on_spark)


@pytest.mark.parametrize("how", ["inner", "left", "right", "outer"])
@pytest.mark.parametrize("assigner", [TumblingWindows(100), SlidingWindows(150, 50), SessionWindows(40)],
                         ids=["tumbling", "sliding", "sessions"])
def test_a_window_join(spark, tmp_path, assigner, how):
    pairs = joined_on_both(spark, tmp_path, shuffled(LEFT, 1, DELAY), shuffled(RIGHT, 2, DELAY),
                           lambda a, b: a.join(b, left_key=k, right_key=k, window=assigner, how=how, name="wj"))
    assert pairs == window_reference(LEFT, RIGHT, assigner, how)


@pytest.mark.parametrize("lower, upper", [(-30, 20), (-120, -40), (0, 0)])
def test_an_interval_join(spark, tmp_path, lower, upper):
    pairs = joined_on_both(spark, tmp_path, shuffled(LEFT, 3, DELAY), shuffled(RIGHT, 4, DELAY),
                           lambda a, b: a.interval_join(b, left_key=k, right_key=k, lower_ms=lower, upper_ms=upper,
                                                        name="ij"))
    assert pairs == interval_reference(LEFT, RIGHT, lower, upper)


def changes(n: int, seed: int) -> list[dict]:
    """A table's changelog in time order, one in five a tombstone (value None)."""
    rng = random.Random(seed)
    table = [{"id": f"v{i}", "k": key, "t": ts, "v": None if rng.random() < 0.2 else i}
             for i, (key, ts) in enumerate(drawn(n, seed))]
    return sorted(table, key=t)


def table_value(change):
    return None if change["v"] is None else change


@pytest.mark.parametrize("how", ["inner", "left"])
@pytest.mark.parametrize("ttl_ms", [None, 80])
def test_an_as_of_join_with_tombstones_and_ttl(spark, tmp_path, ttl_ms, how):
    table = changes(120, 5)
    pairs = joined_on_both(spark, tmp_path, shuffled(LEFT, 5, DELAY), table,
                           lambda a, b: a.join_table(b, key=k, table_key=k, as_of="event_time", ttl_ms=ttl_ms, how=how,
                                                     table_value=table_value, name="tj"))
    assert pairs == as_of_reference(LEFT, table, ttl_ms, how)


def arrival_watermarks(events: list[dict]) -> list[int]:
    """The watermark in force as each event arrives: its source's after the batch before."""
    watermarks, newest = [], None
    for start in range(0, len(events), BATCH):
        batch = events[start:start + BATCH]
        watermarks += [WATERMARK_MIN if newest is None else newest - DELAY - 1] * len(batch)
        newest = max([e["t"] for e in batch] + ([] if newest is None else [newest]))
    return watermarks


def latest_reference(stream: list[dict], table: list[dict]) -> Counter:
    """A left join with the latest value, in the order Spark feeds the operator: by the
    watermark at arrival, the stream before the table, then input position."""
    order = sorted([(w, 0, i, e) for i, (w, e) in enumerate(zip(arrival_watermarks(stream), stream))] +
                   [(w, 1, i, e) for i, (w, e) in enumerate(zip(arrival_watermarks(table), table))],
                   key=lambda item: item[:3])
    current, pairs = {}, Counter()
    for _, side, _, e in order:
        if side:
            current[e["k"]] = table_value(e)
        else:
            pairs[(e["id"], current[e["k"]]["id"] if current.get(e["k"]) else None)] += 1
    return pairs


def test_a_latest_value_join_takes_the_value_current_in_the_documented_order(spark, tmp_path):
    """Which value a record takes depends on how the inputs interleave, which varies on the
    bus; on Spark it is the order the docs give."""
    table, stream = changes(150, 6), shuffled(LEFT, 6, DELAY)
    build = lambda a, b: stamped(a.join_table(b, key=k, table_key=k, how="left", table_value=table_value, name="tj"))
    result = SparkRunner(spark=spark).run(pipeline(stream, table, build, str(tmp_path / "out")))
    assert result.state == AppState.SUCCEEDED, result.error
    rows = read_jsonl(tmp_path / "out")
    assert Counter((left, right) for left, right, _, _ in rows) == latest_reference(stream, table)
    assert {(left, ts, key) for left, _, ts, key in rows} == {(e["id"], e["t"], e["k"]) for e in stream}


# --- keyed state and timers --------------------------------------------------------------


EVENTS = [{"k": key, "t": ts, "i": i} for i, (key, ts) in enumerate(drawn(300, 7, 6000))]


def keyed(events: list[dict], build, path: str) -> Pipeline:
    """``build(grouped)`` over events grouped by key, written to ``path``."""
    p = Pipeline("keyed", parallelism=2, config={"batch_records": BATCH})
    grouped = (p.from_collection(events, timestamp_fn=t, max_out_of_orderness_ms=DELAY, name="events")
               .group_by(k, name="by_key"))
    build(grouped).write_jsonl(path, name="out")
    return p


def running(seen, event):
    """A key's count so far and the previous event's position."""
    count, previous = seen or (0, None)
    return (count + 1, event["i"]), [event["k"], count + 1, previous]


@pytest.mark.parametrize("ttl_ms", [None, 120])
def test_stateful_map_with_and_without_ttl(spark, tmp_path, ttl_ms):
    """One source task feeds each keyed task in one order on the bus, and so does Spark:
    the outputs are the same, forgotten states included."""
    events = shuffled(EVENTS, 8, DELAY)
    on_spark, on_bus = on_both(spark, tmp_path, lambda path: keyed(
        events, lambda g: g.stateful_map(running, ttl_ms=ttl_ms, name="running"), path))
    assert Counter(map(tuple, on_spark)) == Counter(map(tuple, on_bus))
    if ttl_ms is None:
        per_key = Counter(e["k"] for e in EVENTS)
        assert Counter((key, n) for key, n, _ in on_spark) == Counter(
            (key, n) for key, total in per_key.items() for n in range(1, total + 1))
    else:
        assert Counter(n for _, n, _ in on_spark)[1] > 4  # some keys were forgotten


def test_event_time_timers(spark, tmp_path):
    on_spark, on_bus = on_both(spark, tmp_path, lambda path: keyed(
        shuffled(EVENTS, 9, DELAY), lambda g: g.process_keyed(Buckets, name="buckets"), path))
    buckets = [Counter((r["k"], r["n"], r["at"]) for r in rows) for rows in (on_spark, on_bus)]
    assert buckets[0] == buckets[1] == buckets_reference(EVENTS)


class Quiet(KeyedProcessFunction):
    """On a timer 150 ms after each record: the key's count (forgotten 100 ms after its last
    record) and the watermark."""

    def process(self, value, ctx):
        ctx.state = (ctx.state or 0) + 1
        ctx.register_event_time_timer(ctx.timestamp + 150)

    def on_timer(self, timestamp, ctx):
        ctx.emit([ctx.key, timestamp, ctx.state, ctx.watermark])


def test_timers_with_ttl_see_the_watermarks_the_bus_sees(spark, tmp_path):
    """Whether a timer sees its key's state depends on which watermarks came before it,
    the one after the source's last batch included."""
    on_spark, on_bus = on_both(spark, tmp_path, lambda path: keyed(
        shuffled(EVENTS, 10, DELAY), lambda g: g.process_keyed(Quiet, ttl_ms=100, name="quiet"), path))
    assert Counter(map(tuple, on_spark)) == Counter(map(tuple, on_bus))
    assert {state for _, _, state, _ in on_spark} > {None, 1}


def test_event_time_timers_over_a_jetstream_replay(spark, tmp_path, nats_server):
    """Records that carry their arrival watermark from the source (kept per subject)."""
    url = nats_server.url
    ensure_stream(url, "KEYED", ["keyed.*"])
    events = shuffled(EVENTS, 11, DELAY)
    publish(url, [(f"keyed.{e['i'] % 3}", json.dumps(e).encode()) for e in events])

    def make(path: str) -> Pipeline:
        p = Pipeline("keyed", parallelism=2, config={"batch_records": BATCH})
        (p.read_jetstream("KEYED", "keyed.*", until="now", timestamp_fn=t, max_out_of_orderness_ms=DELAY,
                          servers=url, name="events")
          .group_by(k, name="by_key").process_keyed(Buckets, name="buckets").write_jsonl(path, name="out"))
        return p

    on_spark, on_bus = on_both(spark, tmp_path, make)
    buckets = [Counter((r["k"], r["n"], r["at"]) for r in rows) for rows in (on_spark, on_bus)]
    assert buckets[0] == buckets[1] == buckets_reference(EVENTS)


# --- what fails ----------------------------------------------------------------------------


class Remind(KeyedProcessFunction):
    def process(self, value, ctx):
        ctx.register_processing_time_timer(ctx.processing_time() + 1000)

    def on_timer(self, timestamp, ctx):
        ctx.emit(timestamp)


def failed(spark, tmp_path, make):
    result = SparkRunner(spark=spark).run(make(str(tmp_path / "out")))
    assert result.state == AppState.FAILED
    assert "org.apache" not in result.error.message
    return result.error


def test_a_processing_time_timer_fails_the_run_naming_the_step(spark, tmp_path):
    error = failed(spark, tmp_path, lambda path: keyed(
        EVENTS[:5], lambda g: g.process_keyed(Remind, name="remind"), path))
    assert error.error_type == "NotImplementedError"
    assert "processing-time timers are not supported on the spark runner" in error.message
    assert "(step 'remind' on record {'k': " in error.message


@pytest.mark.parametrize("key, error_type, message", [
    (lambda e: 1 // (e["k"] - 2), "ZeroDivisionError", "integer division or modulo by zero"),
    (lambda e: [e["k"]], "TypeError", "its join key [2] is of unhashable type list (return a tuple instead"),
])
def test_a_failing_key_function_names_the_step_and_the_record(spark, tmp_path, key, error_type, message):
    left = [{"id": "l0", "k": 1, "t": 5}, {"id": "l1", "k": 2, "t": 7}]
    error = failed(spark, tmp_path, lambda path: pipeline(
        left[1:] if error_type == "TypeError" else left, RIGHT[:3],
        lambda a, b: a.join(b, left_key=key, right_key=k, window=TumblingWindows(10), name="wj"), path))
    assert error.error_type == error_type
    assert message in error.message and "(step 'wj' on record {'id': 'l1', 'k': 2, 't': 7})" in error.message
