"""Keyed state and timers: ``stateful_map`` and ``process_keyed`` on the test runner
against references, under any parallelism and interleaving and through executor losses;
TTLs, processing-time timers and snapshots on the operators themselves; and the errors
a user sees."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus import CollectSink, GraphError, Pipeline
from gearbus.api.keyed import KeyedProcessFunction
from gearbus.api.watermarks import WATERMARK_MAX
from gearbus.runners import PipelineFailed, TestRunner
from gearbus.runtime.keygroups import unserialisable_part
from gearbus.runtime.keyed import KeyedProcessOp, StatefulMapOp
from gearbus.runtime.state_backend import MemoryBackend
from tests.support.files import read_jsonl
from tests.support.joins import Buckets, buckets_reference, shuffled

FAST = settings(max_examples=40, deadline=None)
DELAY = 30


def keyed_pipeline(events, parallelism=2, name="keyed"):
    pipeline = Pipeline(name, parallelism=parallelism, config={"batch_records": 6})
    stream = pipeline.from_collection(events, timestamp_fn=lambda e: e["t"], max_out_of_orderness_ms=DELAY,
                                      name="events")
    return pipeline, stream.group_by(lambda e: e["k"], name="by_key")


events = st.lists(st.tuples(st.integers(0, 4), st.integers(0, 1500)), max_size=40)


def as_events(drawn) -> list[dict]:
    return [{"k": key, "t": ts, "i": i} for i, (key, ts) in enumerate(drawn)]


@FAST
@given(events, st.integers(1, 3), st.integers(0, 1000))
def test_stateful_map_threads_each_keys_state_through_its_records(drawn, parallelism, seed):
    records = as_events(drawn)
    pipeline, grouped = keyed_pipeline(records, parallelism)
    out = CollectSink()
    (grouped.stateful_map(lambda seen, e: ((seen or 0) + 1, (e["k"], (seen or 0) + 1)), name="running_count")
            .sink(out, name="out"))
    TestRunner(seed=seed).run(pipeline)
    per_key = Counter(e["k"] for e in records)
    assert Counter(out.values) == Counter((key, n) for key, total in per_key.items() for n in range(1, total + 1))


@FAST
@given(events, st.integers(1, 3), st.integers(0, 1000))
def test_event_time_timers_fire_once_the_watermark_passes_them(drawn, parallelism, seed):
    records = as_events(drawn)
    pipeline, grouped = keyed_pipeline(shuffled(records, seed, DELAY), parallelism)
    out = CollectSink()
    grouped.process_keyed(Buckets, name="buckets").sink(out, name="out")
    TestRunner(seed=seed).run(pipeline)
    assert Counter((r["k"], r["n"], r["at"]) for r in out.values) == buckets_reference(records)


@pytest.mark.parametrize("seed, backend", [(1, "memory"), (2, "memory"), (1, "rocksdb"), (2, "rocksdb")])
def test_keyed_state_and_timers_are_exact_through_executor_losses(inprocess, tmp_path, seed, backend):
    records = as_events([(i % 7, i * 13 + (i % 5) * 40) for i in range(400)])
    pipeline, grouped = keyed_pipeline(shuffled(records, seed, DELAY), 2, "recovery")
    pipeline.config["state_backend"] = backend
    grouped.process_keyed(Buckets, name="buckets").write_jsonl(str(tmp_path / "buckets.jsonl"), name="out")
    engine = inprocess(pipeline, seed=seed, checkpoint_every=3, batch_records=5)
    engine.run(kill_executor_after_frames=[50, 140])
    assert engine.epoch == 2
    assert Counter((r["k"], r["n"], r["at"]) for r in read_jsonl(tmp_path / "buckets.jsonl")) == buckets_reference(records)


def test_a_timers_output_carries_its_time_and_state_is_empty_at_the_end():
    op = KeyedProcessOp("buckets", Buckets, None)
    op.open(_Task())
    op.process([({"t": 10}, 10, "a"), ({"t": 150}, 150, "a"), ({"t": 20}, 20, "b"), ({"t": 50}, 50, "a")])
    assert op.state_size()[0] == 2
    fired = op.on_watermark(120)  # the buckets ending at 99 are due, a's ending at 199 is not
    assert [(r[0]["k"], r[0]["n"], r[1], r[2]) for r in fired] == [("a", 2, 99, "a"), ("b", 1, 99, "b")]
    assert op.state_size()[0] == 1
    fired = op.on_watermark(WATERMARK_MAX)
    assert [(r[0]["k"], r[0]["n"], r[1]) for r in fired] == [("a", 1, 199)]
    assert op.state_size() == (0, 0)


def test_state_is_forgotten_once_the_watermark_passes_its_ttl():
    op = StatefulMapOp("count", lambda seen, v: ((seen or 0) + 1, (seen or 0) + 1), ttl_ms=100)
    assert [r[0] for r in op.process([("x", 10, "a"), ("x", 20, "a"), ("x", 15, "b")])] == [1, 2, 1]
    op.on_watermark(114)  # b was last written at 15: gone at 115
    assert op.state_size()[0] == 2
    op.on_watermark(115)
    assert op.state_size()[0] == 1
    assert [r[0] for r in op.process([("x", 200, "b"), ("x", 100, "a")])] == [1, 3]  # a written again at 100
    op.on_watermark(199)
    assert set(op.states.values) == {"a", "b"}
    op.on_watermark(200)
    assert set(op.states.values) == {"b"}
    op.on_watermark(300)
    assert op.state_size() == (0, 0)


def test_processing_time_timers_fire_when_the_clock_reaches_them():
    class Remind(KeyedProcessFunction):
        def process(self, value, ctx):
            ctx.register_processing_time_timer(value)

        def on_timer(self, timestamp, ctx):
            ctx.emit((ctx.key, timestamp))

    op = KeyedProcessOp("remind", Remind, None)
    op.open(_Task())
    op.on_watermark(500)
    op.process([(2_000, 1, "a"), (1_000, 1, "b"), (3_000, 1, "c")])
    assert op.next_wakeup_ms() == 1_000
    fired = op.on_wakeup(2_500)
    assert [r[0] for r in fired] == [("b", 1_000), ("a", 2_000)]
    assert all(r[1] == 501 for r in fired)  # never late downstream: just past the watermark
    assert op.next_wakeup_ms() == 3_000


def test_a_keyed_operator_restored_from_a_snapshot_goes_on_as_the_original():
    records = [({"k": i % 3, "t": i * 40}, i * 40, i % 3) for i in range(60)]
    whole = KeyedProcessOp("buckets", Buckets, 500)
    whole.open(_Task())
    expected = []
    for position, record in enumerate(records):
        if position == 30:
            snapshot = whole.snapshot()
        expected.extend(whole.process([record]) + whole.on_watermark(record[1] - 100))
        if position == 29:
            before = list(expected)
    restored = KeyedProcessOp("buckets", Buckets, 500)
    restored.open(_Task())
    restored.restore(snapshot)
    after = []
    for record in records[30:]:
        after.extend(restored.process([record]) + restored.on_watermark(record[1] - 100))
    # Timers of one time fire in key order before a snapshot and by key group after it.
    assert sorted(before + after, key=repr) == sorted(expected, key=repr)
    assert [r[1] for r in after] == sorted(r[1] for r in after)


def test_keyed_mistakes_are_named():
    pipeline, grouped = keyed_pipeline([{"k": 1, "t": 5}])
    with pytest.raises(GraphError, match="not a KeyedProcessFunction"):
        grouped.process_keyed(dict, name="p")
    with pytest.raises(GraphError, match="not an instance"):
        grouped.process_keyed(Buckets(), name="p")
    with pytest.raises(GraphError, match="ttl_ms must be >= 1"):
        grouped.stateful_map(lambda s, v: (s, v), ttl_ms=0, name="m")
    with pytest.raises(GraphError, match="needs a keyed stream"):
        pipeline.from_collection([], name="plain").stateful_map(lambda s, v: (s, v))


@pytest.mark.parametrize("build, message", [
    (lambda g: g.stateful_map(lambda s, v: v, name="m"), "must return a pair \\(new state, output\\), got {'k': 1"),
    (lambda g: g.process_keyed(lambda v, ctx: ctx.register_event_time_timer(5), name="m"), "timers need an on_timer"),
    (lambda g: g.process_keyed(lambda v, ctx: 1 / 0, name="m"), "division by zero"),
])
def test_a_failing_keyed_function_fails_the_app_naming_step_and_record(build, message):
    pipeline, grouped = keyed_pipeline([{"k": 1, "t": 5}])
    build(grouped).sink(CollectSink(), name="out")
    with pytest.raises(PipelineFailed, match=f"{message}.*step 'm' on record {{'k': 1, 't': 5}}"):
        TestRunner().run(pipeline)


class _Task:
    """What an operator's open() reads of its task."""

    context = None
    state_backend = MemoryBackend()


def test_processing_time_timers_fire_on_the_test_runners_clock():
    """One tick of the engine is a second of processing time: a timer 5 s ahead fires in
    a run that takes milliseconds."""

    class Later(KeyedProcessFunction):
        def process(self, value, ctx):
            ctx.register_processing_time_timer(ctx.processing_time() + 5_000)

        def on_timer(self, timestamp, ctx):
            ctx.emit(("fired", ctx.key))

    pipeline = Pipeline("later", config={"batch_records": 1})
    out = CollectSink()
    (pipeline.from_collection([{"k": 1, "t": i} for i in range(30)], timestamp_fn=lambda e: e["t"], name="events")
        .group_by(lambda e: e["k"], name="by_key").process_keyed(Later, name="later").sink(out, name="out"))
    TestRunner().run(pipeline)
    assert ("fired", 1) in out.values


def test_state_pickle_refuses_is_named_by_its_step_entry_and_type_and_still_sized():
    """What a declined checkpoint says, and the state size metric, which must not fail on it."""
    op = StatefulMapOp("hold", lambda state, value: (state or (lambda: value), value), None)
    op.process([(1, 0, "k")])
    state = {"hold": op.snapshot()}
    assert unserialisable_part(state).startswith("step 'hold', entry ('k', <function ") and \
        unserialisable_part(state).endswith(": a function")
    assert unserialisable_part({"hold": {"groups": {1: [("k", 5, None)]}}}) == ""
    keys, size = op.state_size()
    assert keys == 1 and size > 0
