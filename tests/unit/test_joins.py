"""Joins on the test runner against brute-force references: window joins (every window
kind and every ``how``), interval joins and temporal table joins, with records out of
order within the sources' bound, under any parallelism and interleaving, through
executor losses; their state empties once the watermark passes; bad joins fail when the
pipeline is built, naming the step."""

from __future__ import annotations

import contextlib
import copy
import pickle
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus import CollectSink, GraphError, Pipeline, SessionWindows, SlidingWindows, TumblingWindows
from gearbus.api.joins import Joined
from gearbus.planner import describe, plan
from gearbus.runners import PipelineFailed, TestRunner
from gearbus.runners.inprocess import SimulatedCrash
from gearbus.runtime.joins import IntervalJoinOp, TableJoinOp
from gearbus.runtime.state_backend import BACKENDS
from gearbus.runtime.windows import WindowOperator
from tests.support.backends import task_holding_state_in
from tests.support.chains import added_up, snapshot_into
from tests.support.files import read_jsonl
from tests.support.rescale import rescaled
from tests.support.joins import (
    as_of_reference,
    bounded_order,
    ids,
    interval_reference,
    k,
    numbered,
    shuffled,
    t,
    window_reference,
)

FAST = settings(max_examples=40, deadline=None)
#: Each example holds the joins' state in a backend drawn at random: both are covered
#: without running every example twice.
BACKEND = st.sampled_from(BACKENDS)
DELAY = 50  # the sources' max_out_of_orderness_ms


def run(left: list[dict], right: list[dict], build, parallelism: int = 2, seed: int = 0,
        backend: str = "memory") -> list:
    pipeline = Pipeline("joins", parallelism=parallelism, config={"batch_records": 7, "state_backend": backend})
    a = pipeline.from_collection(left, timestamp_fn=t, max_out_of_orderness_ms=DELAY, name="left")
    b = pipeline.from_collection(right, timestamp_fn=t, max_out_of_orderness_ms=DELAY, name="right")
    out = CollectSink()
    build(a, b).sink(out)
    TestRunner(seed=seed).run(pipeline)
    return out.values


events = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 600)), max_size=25)


# --- window joins ----------------------------------------------------------------------


ASSIGNERS = [TumblingWindows(100), SlidingWindows(150, 50), SessionWindows(40)]


@FAST
@given(events, events, st.sampled_from(ASSIGNERS), st.sampled_from(["inner", "left", "right", "outer"]),
       st.integers(1, 3), st.integers(0, 1000), BACKEND)
def test_a_window_join_pairs_each_keys_records_of_a_window(left, right, assigner, how, parallelism, seed, backend):
    left, right = numbered(left, "l"), numbered(right, "r")
    got = run(bounded_order(shuffled(left, seed, DELAY), DELAY), bounded_order(shuffled(right, seed + 1, DELAY), DELAY),
              lambda a, b: a.join(b, left_key=k, right_key=k, window=assigner, how=how, name="wj"),
              parallelism, seed, backend)
    assert ids(got) == window_reference(left, right, assigner, how)


def test_a_window_join_result_is_stamped_with_the_windows_last_instant():
    pipeline = Pipeline("stamps")
    a = pipeline.from_collection([{"id": 1, "k": 1, "t": 120}], timestamp_fn=t)
    b = pipeline.from_collection([{"id": 2, "k": 1, "t": 180}], timestamp_fn=t)
    out = CollectSink()
    (a.join(b, left_key=k, right_key=k, window=TumblingWindows(100), name="wj")
      .group_by(lambda pair: 0)
      .process_keyed(lambda pair, ctx: ctx.emit((pair, ctx.timestamp)), name="stamp")
      .sink(out))
    TestRunner().run(pipeline)
    assert out.values == [(Joined({"id": 1, "k": 1, "t": 120}, {"id": 2, "k": 1, "t": 180}), 199)]


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_joins_state_empties_as_the_watermark_passes_its_windows(backend, backends):
    from gearbus.runtime.joins import CoGroup, WindowJoinOp

    op = WindowJoinOp("wj", lambda: WindowOperator(TumblingWindows(100), CoGroup()), "inner")
    op.open(task_holding_state_in(backend, backends))
    assert op.process([((0, "a"), 10, "k"), ((1, "b"), 20, "k"), ((0, "c"), 150, "k")]) == []
    assert op.state_size()[0] == 2
    out = op.on_watermark(99)
    assert [r[0] for r in out] == [Joined("a", "b")] and out[0][1] == 99
    assert op.state_size()[0] == 1
    op.on_watermark(199)
    assert op.state_size() == (0, 0)


# --- interval joins --------------------------------------------------------------------


@FAST
@given(events, events, st.integers(-120, 60), st.integers(0, 150), st.integers(1, 3), st.integers(0, 1000), BACKEND)
def test_an_interval_join_pairs_records_within_the_bounds(left, right, lower, width, parallelism, seed, backend):
    left, right = numbered(left, "l"), numbered(right, "r")
    upper = lower + width
    got = run(shuffled(left, seed, DELAY), shuffled(right, seed + 1, DELAY),
              lambda a, b: a.interval_join(b, left_key=k, right_key=k, lower_ms=lower, upper_ms=upper, name="ij"),
              parallelism, seed, backend)
    assert ids(got) == interval_reference(left, right, lower, upper)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_interval_joins_state_empties_once_nothing_can_match(backend, backends):
    op = IntervalJoinOp("ij", -10, 20)
    op.open(task_holding_state_in(backend, backends))
    out = op.process([((0, "l1"), 100, "k"), ((1, "r1"), 115, "k"), ((1, "r2"), 95, "j")])
    assert [r[0] for r in out] == [Joined("l1", "r1")] and out[0][1] == 115
    op.on_watermark(119)  # l1 may still meet a right record at 120
    assert op.state_size()[0] == 2  # l1 and r1 (r2 of key j may meet a left at <= 105: gone at 105)
    op.on_watermark(120)  # l1: done; r1 (115) may still meet a left record up to 125
    assert op.state_size()[0] == 1
    op.on_watermark(125)
    assert op.state_size() == (0, 0)
    assert op.process([((0, "late"), 125, "k")]) == [] and op.late_records == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_interval_join_with_negative_bounds_keeps_nothing_it_cannot_use(backend, backends):
    op = IntervalJoinOp("ij", -30, -10)  # the right record comes 10..30 ms before the left one
    op.open(task_holding_state_in(backend, backends))
    op.process([((1, "r"), 100, "k")])
    out = op.process([((0, "l"), 120, "k")])
    assert [r[0] for r in out] == [Joined("l", "r")]
    op.on_watermark(111)  # l (120) needs a right record at <= 110: none can come; r meets lefts up to 130
    assert op.state_size()[0] == 1
    out = op.process([((0, "l2"), 112, "k")])  # meets r, and no right record that can still come
    assert [r[0] for r in out] == [Joined("l2", "r")] and op.state_size()[0] == 1
    op.on_watermark(130)
    assert op.state_size() == (0, 0)


# --- table joins -----------------------------------------------------------------------


changes = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 600), st.booleans()), max_size=20)


@FAST
@given(events, changes, st.sampled_from([None, 80]), st.sampled_from(["inner", "left"]), st.integers(1, 3),
       st.integers(0, 1000), BACKEND)
def test_an_as_of_join_takes_the_version_valid_at_the_records_time(stream, table, ttl_ms, how, parallelism, seed,
                                                                    backend):
    stream = numbered(stream, "s")
    table = [{"id": f"v{i}", "k": key, "t": ts, "v": None if deleted else i}
             for i, (key, ts, deleted) in enumerate(table)]
    # Changes of one key and time come in their list order (the reference's tie-break).
    table = sorted(table, key=lambda c: c["t"])
    got = run(shuffled(stream, seed, DELAY), table,
              lambda a, b: a.join_table(b, key=k, table_key=k, as_of="event_time", ttl_ms=ttl_ms, how=how,
                                        table_value=lambda c: None if c["v"] is None else c, name="tj"),
              parallelism, seed, backend)
    assert ids(got) == as_of_reference(stream, table, ttl_ms, how)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_latest_table_join_takes_the_value_current_when_the_record_is_processed(backend, backends):
    op = TableJoinOp("tj", "latest", None, "inner", None)
    op.open(task_holding_state_in(backend, backends))
    assert op.process([((0, "early"), 5, "k")]) == []  # the table does not know k yet
    op.process([((1, "v1"), 50, "k")])
    assert [r[0] for r in op.process([((0, "a"), 1, "k")])] == [Joined("a", "v1")]  # time plays no part
    op.process([((1, "v2"), 10, "k")])
    assert [r[0] for r in op.process([((0, "b"), 2, "k")])] == [Joined("b", "v2")]
    op.process([((1, None), 60, "k")])  # a tombstone deletes
    assert op.process([((0, "c"), 3, "k")]) == [] and op.state_size() == (0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_table_keeps_per_key_only_the_versions_that_can_still_match(backend, backends):
    op = TableJoinOp("tj", "event_time", 100, "inner", None)
    op.open(task_holding_state_in(backend, backends))
    op.process([((1, f"v{ts}"), ts, "k") for ts in (10, 20, 30, 40)])
    op.on_watermark(35)  # v30 holds at 36; v10 and v20 can match nothing more
    assert op.state_size()[0] == 2
    op.on_watermark(129)  # v40 still holds for a record at 130..139
    assert op.state_size()[0] == 1
    op.on_watermark(139)  # past its TTL
    assert op.state_size() == (0, 0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_as_of_join_holds_records_until_the_watermark_passes_them(backend, backends):
    op = TableJoinOp("tj", "event_time", None, "inner", None)
    op.open(task_holding_state_in(backend, backends))
    assert op.process([((0, "a"), 100, "k"), ((1, "old"), 50, "k")]) == []
    assert op.process([((1, "new"), 100, "k")]) == []  # at the record's own time: it holds
    assert op.state_size()[0] == 3  # two versions and the waiting record
    out = op.on_watermark(100)
    assert [(r[0], r[1]) for r in out] == [(Joined("a", "new"), 100)]
    assert op.process([((0, "late"), 90, "k")]) == [] and op.late_records == 1


# --- shapes: self-joins, chains, co-partitioning ----------------------------------------


def test_a_self_join_and_a_three_way_chain():
    people = [{"id": f"p{i}", "k": i % 4, "t": i * 10} for i in range(40)]
    got = run(people, [], lambda a, b: a.join(a, left_key=k, right_key=k, window=TumblingWindows(100), name="self"))
    assert ids(got) == window_reference(people, people, TumblingWindows(100), "inner")

    pipeline = Pipeline("chain", parallelism=2)
    sources = [pipeline.from_collection([{"id": f"{s}{i}", "k": i % 3, "t": i * 10} for i in range(30)],
                                        timestamp_fn=t, name=s) for s in "abc"]
    first = sources[0].join(sources[1], left_key=k, right_key=k, window=TumblingWindows(100), name="ab")
    second = first.join(sources[2], left_key=lambda p: p.left["k"], right_key=k, window=TumblingWindows(100),
                        name="abc")
    out = CollectSink()
    second.sink(out)
    TestRunner(seed=5).run(pipeline)
    triples = Counter((p.left.left["id"], p.left.right["id"], p.right["id"]) for p in out.values)
    expected = Counter((f"a{i}", f"b{j}", f"c{m}") for i in range(30) for j in range(30) for m in range(30)
                       if i % 3 == j % 3 == m % 3 and i // 10 == j // 10 == m // 10)
    assert triples == expected


def test_the_plan_co_partitions_both_inputs_by_key_with_the_joins_parallelism():
    pipeline = Pipeline("plan", parallelism=3)
    a = pipeline.from_collection([], timestamp_fn=t, name="a", parallelism=2).map(lambda e: e, name="prep")
    b = pipeline.from_collection([], timestamp_fn=t, name="b")
    a.join(b, left_key=k, right_key=k, window=TumblingWindows(10), name="wj").sink(CollectSink(), name="out", parallelism=3)
    plan_ = describe(plan(pipeline, "test"))
    by_name = {p["name"]: p for p in plan_["processors"]}
    join = by_name["wj+out"]
    assert join["parallelism"] == 3 and join["operators"][0] == "WindowJoinOp"
    inputs = {e["from"]: e["partitioner"] for e in plan_["edges"] if e["to"] == join["id"]}
    assert inputs == {by_name["a+prep"]["id"]: "HashPartitioner", by_name["b"]["id"]: "HashPartitioner"}
    assert by_name["a+prep"]["operators"][-1] == by_name["b"]["operators"][-1] == "JoinInputOp"
    assert join["join"] == {"step": "wj", "operator": "WindowJoinOp", "left": by_name["a+prep"]["id"],
                            "right": by_name["b"]["id"],
                            "co_partitioned": "both sides hash-partitioned by the join key into 3 tasks"}


# --- exactly-once through executor losses ------------------------------------------------


RECOVERING = {
    "interval": (lambda a, b, n=None: a.interval_join(b, left_key=k, right_key=k, lower_ms=-20, upper_ms=20, name="j",
                                                      parallelism=n),
                 lambda left, right: interval_reference(left, right, -20, 20)),
    "window": (lambda a, b, n=None: a.join(b, left_key=k, right_key=k, window=SlidingWindows(60, 20), how="outer",
                                           name="j", parallelism=n),
               lambda left, right: window_reference(left, right, SlidingWindows(60, 20), "outer")),
    "as_of": (lambda a, b, n=None: a.join_table(b, key=k, table_key=k, as_of="event_time", ttl_ms=100, name="j",
                                                parallelism=n),
              lambda left, right: as_of_reference(left, right, 100)),
}
LEFT = numbered([(i % 5, i * 7) for i in range(300)], "l")
RIGHT = numbered([(i % 5, i * 9) for i in range(200)], "r")


def recovering(kind: str, seed: int, output, parallelism: int | None = None) -> Pipeline:
    """Two shuffled sources of two tasks each, joined (in ``parallelism`` tasks), into ``output``."""
    pipeline = Pipeline("recovery", parallelism=2)
    a = pipeline.from_collection(shuffled(LEFT, seed, DELAY), timestamp_fn=t, max_out_of_orderness_ms=DELAY,
                                 name="left")
    b = pipeline.from_collection(shuffled(RIGHT, seed, DELAY), timestamp_fn=t, max_out_of_orderness_ms=DELAY,
                                 name="right")
    (RECOVERING[kind][0](a, b, parallelism)
      .map(lambda pair: [pair.left and pair.left["id"], pair.right and pair.right["id"]], name="ids")
      .write_jsonl(str(output), name="out"))
    return pipeline


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("kind", RECOVERING)
def test_joins_are_exact_through_executor_losses(inprocess, tmp_path, seed, kind):
    engine = inprocess(recovering(kind, seed, tmp_path / "pairs.jsonl"), seed=seed, checkpoint_every=3,
                       batch_records=5)
    engine.run(kill_executor_after_frames=[40, 120])
    assert engine.epoch == 2
    assert Counter(map(tuple, read_jsonl(tmp_path / "pairs.jsonl"))) == RECOVERING[kind][1](LEFT, RIGHT)


@pytest.mark.parametrize("parallelism", [1, 3])
@pytest.mark.parametrize("kind", RECOVERING)
def test_a_joins_state_divides_over_another_parallelism_by_key_group(inprocess, tmp_path, kind, parallelism):
    """Crashed with the join in 2 tasks, resumed with it in 1 or 3: each task restores the
    buffers of its key groups, and the output is exact."""
    output = tmp_path / "pairs.jsonl"
    first = inprocess(recovering(kind, 1, output), seed=1, checkpoint_every=3, batch_records=5)
    with pytest.raises(SimulatedCrash):
        first.run(crash_after_frames=100)
    again = inprocess(recovering(kind, 1, output, parallelism), seed=2, checkpoint_every=3, batch_records=5, epoch=1)
    again.run(restore=rescaled(first.latest_checkpoint(), first.app, again.app))
    assert Counter(map(tuple, read_jsonl(output))) == RECOVERING[kind][1](LEFT, RIGHT)


@pytest.mark.parametrize("kind", RECOVERING)
def test_a_join_rescaled_while_it_runs_then_recovered_is_exact(inprocess, tmp_path, kind):
    """The new tasks divide the old ones' buffers as they restore; their first snapshots are
    whole, built from that share, and the recoveries after restore from them."""
    output = tmp_path / "pairs.jsonl"
    engine = inprocess(recovering(kind, 3, output), seed=3, checkpoint_every=3, batch_records=5)
    engine.run(rescale_after_frames={40: {"j": 3}}, kill_executor_after_frames=[90, 160])
    assert [answer.error for answer in engine.rescales] == [""]
    assert Counter(map(tuple, read_jsonl(output))) == RECOVERING[kind][1](LEFT, RIGHT)
    engine.state.validate()


# --- bad joins ---------------------------------------------------------------------------


def two_streams(timestamps: bool = True):
    pipeline = Pipeline("bad")
    fn = t if timestamps else None
    return pipeline, pipeline.from_collection([], timestamp_fn=fn, name="a"), \
        pipeline.from_collection([], timestamp_fn=fn, name="b")


@pytest.mark.parametrize("build, message", [
    (lambda a, b: a.join(b, right_key=k, window=TumblingWindows(10), name="j"), "left_key is required"),
    (lambda a, b: a.join(b, left_key=k, right_key="k", window=TumblingWindows(10), name="j"), "right_key must be"),
    (lambda a, b: a.join(b, left_key=k, right_key=k, name="j"), "window must be"),
    (lambda a, b: a.join(b, left_key=k, right_key=k, window=TumblingWindows(10), how="full", name="j"), "how must"),
    (lambda a, b: a.join(b.group_by(k), left_key=k, right_key=k, window=TumblingWindows(10), name="j"),
     "can only join a Stream"),
    (lambda a, b: a.interval_join(b, left_key=k, right_key=k, lower_ms=5, upper_ms=1, name="j"), "must not exceed"),
    (lambda a, b: a.interval_join(b, left_key=k, right_key=k, lower_ms=0, name="j"), "upper_ms"),
    (lambda a, b: a.join_table(b, key=k, table_key=k, as_of="now", name="j"), "as_of must"),
    (lambda a, b: a.process_keyed(lambda v, ctx: None, name="p"), "needs a keyed stream"),
])
def test_a_bad_join_fails_when_the_pipeline_is_built(build, message):
    _, a, b = two_streams()
    with pytest.raises(GraphError, match=message):
        build(a, b)


def test_a_join_in_event_time_needs_event_time():
    _, a, b = two_streams(timestamps=False)
    with pytest.raises(GraphError, match="source 'a' stamps records with the time they were read"):
        a.join(b, left_key=k, right_key=k, window=TumblingWindows(10), name="j")
    a.join_table(b, key=k, table_key=k, name="latest")  # a latest-value lookup needs no event time


@pytest.mark.parametrize("key, message", [
    (lambda e: [e["k"]], "join key \\[1\\] is of unhashable type list"),
    (lambda e: None, "join key is None"),
])
def test_a_record_whose_key_cannot_be_joined_fails_the_app_naming_step_and_record(key, message):
    pipeline = Pipeline("bad_key")
    a = pipeline.from_collection([{"k": 1, "t": 5}], timestamp_fn=t, name="a")
    b = pipeline.from_collection([{"k": 1, "t": 5}], timestamp_fn=t, name="b")
    a.join(b, left_key=key, right_key=k, window=TumblingWindows(10), name="wj").sink(CollectSink(), name="out")
    with pytest.raises(PipelineFailed, match=f"{message}.*step 'wj' on record {{'k': 1, 't': 5}}"):
        TestRunner().run(pipeline)


# --- incremental snapshots ---------------------------------------------------------------


JOIN_EVENTS = st.lists(st.one_of(
    st.tuples(st.just("record"), st.integers(0, 1), st.one_of(st.integers(0, 30), st.sampled_from(["a", ("t", 1)])),
              st.integers(0, 60), st.one_of(st.integers(0, 9), st.none())),
    st.tuples(st.just("record"), st.integers(0, 1), st.one_of(st.integers(0, 30), st.sampled_from(["a", ("t", 1)])),
              st.integers(0, 60), st.one_of(st.integers(0, 9), st.none())),
    st.tuples(st.just("watermark"), st.integers(0, 15)),
    st.tuples(st.sampled_from(["snapshot", "snapshot", "complete", "complete", "compact", "restore"])),
    st.tuples(st.sampled_from(["snapshot", "complete"])),
), min_size=20, max_size=80)
JOINS = {"interval": lambda: IntervalJoinOp("ij", -10, 20),
         "latest": lambda: TableJoinOp("tj", "latest", None, "left", None),
         "as of": lambda: TableJoinOp("tj", "event_time", 25, "inner", None)}


@settings(max_examples=60, deadline=None)
@given(events=JOIN_EVENTS, join=st.sampled_from(sorted(JOINS)), max_depth=st.sampled_from([0, 2, 4]),
       backend=BACKEND, slack=st.sampled_from([0, 1024]))
def test_a_chain_of_join_snapshots_adds_up_to_the_whole_state(events, join, max_depth, backend, slack):
    """Snapshots each holding what changed since the last completed one's, with
    completions, compactions and restores between: every chain adds up to the whole
    snapshot taken at the same point, and a join restored from one joins what the
    uninterrupted join does (``slack`` 0: the change log forgets often, snapshots go
    whole)."""
    from gearbus.runtime.snapshots import Lineage

    with contextlib.ExitStack() as backends:
        def opened():
            op = JOINS[join]()
            op.open(task_holding_state_in(backend, backends))
            op.changes.SLACK = slack
            return op

        op, plain, watermark = opened(), JOINS[join](), 0
        lineage, stored, truth, completed = Lineage(max_depth), {}, {}, []
        for kind, *args in events:
            if kind == "record":
                side, key, timestamp, value = args
                record = [((side, value), watermark + timestamp, key)]
                assert op.process(record) == plain.process(record)
            elif kind == "watermark":
                watermark += args[0]
                assert op.on_watermark(watermark) == plain.on_watermark(watermark)
            elif kind == "snapshot":
                truth[snapshot_into(stored, lineage, op, watermark)] = copy.deepcopy(plain.snapshot())
            elif kind == "complete" and stored:
                completed.append(max(stored))
                lineage.completed(max(stored))
            elif kind == "compact" and completed:
                stored[completed[-1]] = stored[completed[-1]].whole(added_up(stored, completed[-1])).self_contained()
                lineage.compacted(completed[-1])
            elif kind == "restore" and completed:  # as after a crash: what the last completed one holds
                op = opened()
                op.restore(pickle.loads(pickle.dumps(added_up(stored, completed[-1]))))
                lineage.restored(stored[completed[-1]].link)
                plain = JOINS[join]()
                plain.restore(copy.deepcopy(truth[completed[-1]]))
                stored = {c: envelope for c, envelope in stored.items() if c <= completed[-1]}
        for checkpoint_id in stored:
            assert as_entries(added_up(stored, checkpoint_id)) == as_entries(truth[checkpoint_id])


def as_entries(state: dict) -> tuple:
    """A join's state with its entries as a set (their order within a group is the order
    they changed in, not kept)."""
    rest = {name: value for name, value in state.items() if name != "groups"}
    return rest, sorted(repr(entry) for entries in state["groups"].values() for entry in entries)
