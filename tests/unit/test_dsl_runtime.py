"""DSL pipelines on the TestRunner (in-process, deterministic) with CollectSink:
exact results, values through the wire codec, window results, custom tasks, the errors
bad input produces, and late data."""

from __future__ import annotations

import collections
import json

import pytest

from gearbus import (
    WATERMARK_MAX,
    WATERMARK_MIN,
    Accumulation,
    CollectSink,
    DataSink,
    DataSource,
    GlobalWindows,
    Mean,
    Pipeline,
    Record,
    Task,
    Triggers,
    TumblingWindows,
    WindowResult,
)
from gearbus.api.task import now_ms
from gearbus.connectors import files
from gearbus.runners import PipelineFailed, TestRunner

LINES = ["the cat sat", "on the mat", "", "the end"]
WORDS = [w for line in LINES for w in line.split()]


def run(pipeline: Pipeline) -> None:
    result = TestRunner().run(pipeline)
    assert result.succeeded


def failure(pipeline: Pipeline):
    """Run a pipeline that must fail; return its AppError."""
    with pytest.raises(PipelineFailed) as failed:
        TestRunner().run(pipeline)
    error = failed.value.error
    result = TestRunner().run(pipeline, raise_on_failure=False)  # the same error as a RunResult
    assert result.state == "FAILED" and not result.succeeded
    assert (result.error.error_type, result.error.message) == (error.error_type, error.message)
    return error


def words_pipeline(name: str = "words", parallelism: int = 1, **source) -> tuple[Pipeline, object]:
    p = Pipeline(name, parallelism=parallelism)
    return p, p.from_collection(LINES, name="lines", **source).flat_map(str.split, name="split")


# --- exact results ------------------------------------------------------------------


def test_map_flat_map_and_filter():
    out = []
    p = Pipeline("stateless")
    (p.from_collection(LINES, name="lines").flat_map(str.split, name="split").map(str.upper, name="upper")
        .filter(lambda w: w != "THE", name="no_the").sink(CollectSink(out), name="out"))
    run(p)
    assert out == ["CAT", "SAT", "ON", "MAT", "END"]


def test_parallel_sources_read_every_item_once():
    out = []
    p = Pipeline("parallel", parallelism=3)
    p.from_collection(range(100), parallelism=3, name="src").map(lambda x: x * 2).sink(CollectSink(out), 2)
    run(p)
    assert sorted(out) == [x * 2 for x in range(100)]


def test_merge_is_the_union_of_its_inputs():
    out = []
    p = Pipeline("union", parallelism=2)
    evens = p.from_collection(range(0, 20, 2), name="evens", parallelism=2)
    odds = p.from_collection(range(1, 20, 2), name="odds").map(lambda x: -x, name="negate")
    more = p.from_collection(["x", "y"], name="more")
    evens.merge(odds, more, name="all").sink(CollectSink(out), name="out")
    run(p)
    assert sorted(out, key=str) == sorted(list(range(0, 20, 2)) + [-x for x in range(1, 20, 2)] + ["x", "y"],
                                          key=str)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_keyed_aggregations_over_the_global_window(parallelism):
    expected = collections.Counter(WORDS)
    results = {name: [] for name in ("count", "sum", "reduce", "fold", "mean")}
    p, words = words_pipeline(parallelism=parallelism)
    pairs = words.map(lambda w: (w, len(w)), name="pair")
    by_word = pairs.group_by(lambda t: t[0], name="by_word")
    # one grouped stream per aggregation, so each one plans like it would alone
    pairs2 = [pairs.map(lambda t: t, name=f"copy_{i}").group_by(lambda t: t[0], name=f"by_word_{i}")
              for i in range(4)]
    by_word.count(name="count").sink(CollectSink(results["count"]), name="out_count")
    pairs2[0].sum(lambda t: t[1], name="sum").sink(CollectSink(results["sum"]), name="out_sum")
    pairs2[1].reduce(lambda a, b: (a[0], a[1] + b[1]), name="reduce").sink(CollectSink(results["reduce"]),
                                                                           name="out_reduce")
    pairs2[2].fold(0, lambda acc, t: acc + 1, name="fold").sink(CollectSink(results["fold"]), name="out_fold")
    pairs2[3].aggregate(Mean(lambda t: t[1] * 2), name="mean").sink(CollectSink(results["mean"]), name="out_mean")
    run(p)

    def by_key(rows):
        keys = [r.key for r in rows]
        assert len(keys) == len(set(keys)), f"a key emitted twice: {rows}"
        return {r.key: r.value for r in rows}

    assert by_key(results["count"]) == dict(expected)
    assert by_key(results["sum"]) == {w: n * len(w) for w, n in expected.items()}
    assert by_key(results["reduce"]) == {w: (w, n * len(w)) for w, n in expected.items()}
    assert by_key(results["fold"]) == dict(expected)
    assert by_key(results["mean"]) == {w: float(len(w) * 2) for w in expected}


def test_a_fold_sees_values_in_arrival_order():
    out = []
    p = Pipeline("fold")
    (p.from_collection(range(10), name="src").group_by(lambda x: x % 2, name="parity")
        .fold([], lambda acc, x: acc + [x], name="seen").map(lambda r: (r.key, r.value), name="pair")
        .sink(CollectSink(out), name="out"))
    run(p)
    assert sorted(out) == [(0, [0, 2, 4, 6, 8]), (1, [1, 3, 5, 7, 9])]


@pytest.mark.parametrize("aggregation", ["fold", "reduce"])  # without and with the map-side combine
def test_tuples_stay_tuples_through_a_group_by_shuffle(aggregation):
    out, seen = [], []
    p = Pipeline("tuples", parallelism=2)
    grouped = (p.from_collection([("a", (1, 2)), ("b", (3, 4)), ("a", (5, 6))], name="src")
               .group_by(lambda t: (t[0], "key"), name="k"))

    def fold(acc, value):
        seen.append(value)
        return acc + (value,)

    def reduce(a, b):
        seen.extend([a, b])
        return (a[0], a[1] + b[1])

    stream = grouped.fold((), fold, name="agg") if aggregation == "fold" else grouped.reduce(reduce, name="agg")
    stream.sink(CollectSink(out), name="out")
    run(p)
    assert seen and all(type(v) is tuple and type(v[1]) is tuple for v in seen), seen
    assert all(type(r) is WindowResult and type(r.key) is tuple for r in out)
    got = {r.key: r.value for r in out}
    if aggregation == "fold":
        assert got == {("a", "key"): (("a", (1, 2)), ("a", (5, 6))), ("b", "key"): (("b", (3, 4)),)}
    else:
        assert got == {("a", "key"): ("a", (1, 2, 5, 6)), ("b", "key"): ("b", (3, 4))}
    assert type(got[("a", "key")]) is tuple and type(got[("a", "key")][1]) is tuple


def test_values_go_through_the_wire_codec_between_processors():
    out = []
    p = Pipeline("codec", parallelism=2)

    class Sub(dict):
        pass

    (p.from_collection([0], name="src", parallelism=2).map(lambda _: {"d": Sub(x=1), "t": (1, [2, (3,)]),
                                                                      "b": b"\x00"}, name="make")
        .sink(CollectSink(out), name="out"))  # parallelism 1: a shuffle
    run(p)
    [value] = out
    assert value == {"d": {"x": 1}, "t": (1, [2, (3,)]), "b": b"\x00"}
    assert type(value["d"]) is dict and type(value["t"]) is tuple and type(value["t"][1][1]) is tuple


def test_window_result_fields():
    out = []
    p = Pipeline("windows")
    events = [("a", 1_000), ("a", 4_000), ("b", 9_999), ("a", 10_000), ("b", 25_000)]
    (p.from_collection(events, timestamp_fn=lambda e: e[1], name="src").group_by(lambda e: e[0], name="k")
        .window(TumblingWindows(10_000)).count(name="n").sink(CollectSink(out), name="out"))
    run(p)
    assert sorted(out) == [
        WindowResult("a", 1, 10_000, 20_000, "on_time"),
        WindowResult("a", 2, 0, 10_000, "on_time"),
        WindowResult("b", 1, 0, 10_000, "on_time"),
        WindowResult("b", 1, 20_000, 30_000, "on_time"),
    ]
    first = out[0]
    assert type(first) is WindowResult
    assert (first.key, first.value, first.window_start, first.window_end, first.timing, first.final) == \
        (first[0], first[1], first[2], first[3], first[4], True)


def test_early_panes_are_not_final_and_discarding_panes_sum_to_the_total():
    out = []
    p = Pipeline("early")
    events = [("a", t) for t in range(0, 7)] + [("a", 12)]
    (p.from_collection(events, timestamp_fn=lambda e: e[1], name="src").group_by(lambda e: e[0], name="k")
        .window(TumblingWindows(10), trigger=Triggers.repeat(Triggers.count(3)), accumulation=Accumulation.DISCARDING)
        .count(name="n").sink(CollectSink(out), name="out"))
    run(p)
    first_window = [(r.value, r.timing, r.final) for r in out if r.window_start == 0]
    assert first_window == [(3, "early", False), (3, "early", False), (1, "on_time", True)]
    assert [(r.value, r.timing) for r in out if r.window_start == 10] == [(1, "on_time")]


class Journal:
    """A shared log of what a source read and a sink wrote, in order."""

    def __init__(self):
        self.events: list[tuple] = []


class JournalSource(DataSource):
    def __init__(self, journal: Journal, items):
        self.journal, self.items = journal, list(items)

    def __deepcopy__(self, memo):
        return self

    def open(self, context):
        self.pos = 0

    def read(self, max_records):
        if self.pos >= len(self.items):
            self.journal.events.append(("end",))
            return None
        batch = self.items[self.pos:self.pos + 1]
        self.pos += 1
        self.journal.events.append(("read", batch[0]))
        return [Record(v, now_ms()) for v in batch]


class JournalSink(DataSink):
    def __init__(self, journal: Journal):
        self.journal = journal

    def __deepcopy__(self, memo):
        return self

    def write(self, records):
        self.journal.events.extend(("write", r.value) for r in records)


@pytest.mark.parametrize("aggregate", ["count", "fold"])
def test_global_window_aggregations_emit_once_at_the_end(aggregate):
    journal = Journal()
    p = Pipeline("global", config={"batch_records": 1})
    grouped = p.source(JournalSource(journal, WORDS), name="src").group_by(lambda w: w, name="k")
    stream = grouped.count(name="agg") if aggregate == "count" else grouped.fold(0, lambda a, w: a + 1, name="agg")
    stream.sink(JournalSink(journal), name="out")
    run(p)
    kinds = [e[0] for e in journal.events]
    assert kinds.count("read") == len(WORDS)
    end = kinds.index("end")
    assert "write" not in kinds[:end]
    writes = [e[1] for e in journal.events if e[0] == "write"]
    assert sorted((r.key, r.value) for r in writes) == sorted(collections.Counter(WORDS).items())
    assert all((r.window_start, r.window_end, r.timing, r.final) == (WATERMARK_MIN, WATERMARK_MAX, "on_time", True)
               for r in writes)


def test_event_time_windows_emit_before_the_end():
    journal = Journal()
    p = Pipeline("tumbling", config={"batch_records": 1})
    (p.source(JournalSource(journal, [("a", 1), ("a", 2), ("a", 15), ("a", 30)]), name="src",
              timestamp_fn=lambda e: e[1])
        .group_by(lambda e: e[0], name="k").window(TumblingWindows(10)).count(name="n")
        .sink(JournalSink(journal), name="out"))
    run(p)
    kinds = [e[0] for e in journal.events]
    assert kinds.index("write") < kinds.index("end")
    assert [(e[1].window_start, e[1].value) for e in journal.events if e[0] == "write"] == [(0, 2), (10, 1), (30, 1)]


class Tagger(Task):
    """A custom low-level task: prefixes each value, and emits a total at the end."""

    def on_start(self):
        self.prefix = self.context.config["prefix"]
        self.seen = 0

    def on_next(self, record):
        self.seen += 1
        self.emit(f"{self.prefix}{record.value}")

    def on_end(self):
        self.emit(f"total {self.seen}")


@pytest.mark.parametrize("parallelism", [1, 2])
def test_a_custom_task_inside_a_pipeline(parallelism):
    out = []
    p = Pipeline("custom", parallelism=parallelism)
    (p.from_collection(["a", "b", "c"], name="src").map(str.upper, name="upper")
        .process(Tagger, parallelism=parallelism, name="tag", prefix="#").map(lambda s: s.replace(" ", ":"), name="colon")
        .sink(CollectSink(out), name="out"))
    run(p)
    totals = [v for v in out if v.startswith("total")]
    assert sorted(v for v in out if not v.startswith("total")) == ["#A", "#B", "#C"]
    assert len(totals) == parallelism and sum(int(v.split(":")[1]) for v in totals) == 3


def test_a_custom_task_can_feed_a_group_by():
    out = []
    p = Pipeline("custom-keyed")
    (p.from_collection(["a", "b", "a"], name="src").process(Tagger, name="tag", prefix="")
        .group_by(lambda v: v, name="k").count(name="n").sink(CollectSink(out), name="out"))
    run(p)
    assert sorted((r.key, r.value) for r in out) == [("a", 2), ("b", 1), ("total 3", 1)]


# --- bad input --------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["map", "flat_map", "filter", "group_by"])
def test_a_raising_user_function_names_the_step_the_exception_and_the_record(kind):
    def check(x):
        if x == 7:
            raise ValueError(f"cannot handle {x}")
        return [x] if kind == "flat_map" else x

    p = Pipeline("raising")
    stream = p.from_collection(range(20), name="numbers")
    if kind == "group_by":
        stream.group_by(check, name="bad_step").count(name="n").sink(CollectSink())
    else:
        getattr(stream, kind)(check, name="bad_step").sink(CollectSink())
    error = failure(p)
    assert error.error_type == "ValueError"
    assert error.message == "cannot handle 7 (step 'bad_step' on record 7)"
    assert "numbers+bad_step" in error.where
    assert "ValueError: cannot handle 7" in error.traceback


def test_one_stream_split_by_filters_gives_each_branch_its_records_and_a_raising_one_names_its_step():
    """Filters that start the branches of a fan-out run at the upstream's sender."""
    evens, odds = [], []
    p = Pipeline("split", parallelism=2)
    numbers = p.from_collection(range(20), parallelism=2, name="numbers")
    numbers.filter(lambda n: n % 2 == 0, name="even").map(lambda n: n * 10, name="tens").sink(CollectSink(evens))
    numbers.filter(lambda n: n % 2, name="odd").sink(CollectSink(odds))
    run(p)
    assert sorted(evens) == list(range(0, 200, 20)) and sorted(odds) == list(range(1, 20, 2))

    p = Pipeline("split-raising")
    numbers = p.from_collection(range(20), name="numbers")
    numbers.sink(CollectSink())
    numbers.filter(lambda n: 1 / (n - 7), name="bad_filter").sink(CollectSink())
    error = failure(p)
    assert error.error_type == "ZeroDivisionError"
    assert error.message == "division by zero (step 'bad_filter' on record 7)"


TAGGED = collections.Counter()


def tag(n: int) -> str:
    TAGGED[n] += 1
    return f"n{n}"


def test_a_step_read_by_two_branches_runs_once_per_record():
    TAGGED.clear()
    out = []
    p = Pipeline("once", parallelism=2)
    numbers = p.from_collection(range(10), parallelism=2, name="numbers")
    numbers.sink(CollectSink(), 2, name="raw")
    tagged = numbers.map(tag, name="tag")
    tagged.merge(tagged.filter(lambda t: t.endswith("7"), name="sevens"), name="both").sink(CollectSink(out), 2)
    run(p)
    assert TAGGED == collections.Counter(range(10))
    assert sorted(out) == sorted([f"n{n}" for n in range(10)] + ["n7"])


def test_an_unsendable_value_made_at_a_sender_names_the_step_that_made_it():
    p = Pipeline("unsendable", parallelism=2)
    numbers = p.from_collection(range(4), parallelism=2, name="numbers")
    numbers.sink(CollectSink(), 2, name="raw")
    numbers.map(lambda n: {n}, name="to_set").sink(CollectSink(), name="out")  # a shuffle into one task
    error = failure(p)
    assert error.error_type == "ValueTypeError"
    assert error.message.endswith("(emitted by step 'to_set')")


def test_a_raising_function_after_a_shuffle_shows_the_window_result():
    p = Pipeline("after-shuffle", parallelism=2)
    (p.from_collection(["a", "b", "b"], name="src").group_by(lambda w: w, name="k").count(name="n")
        .map(lambda r: 1 / (r.value - 2), name="divide").sink(CollectSink(), name="out"))
    error = failure(p)
    assert error.error_type == "ZeroDivisionError"
    assert "step 'divide' on record WindowResult(key='b', value=2" in error.message
    assert "n+divide" in error.where


def test_a_huge_offending_record_is_truncated():
    huge = {"payload": "x" * 100_000}
    p = Pipeline("huge")
    p.from_collection([{"payload": "ok", "missing": 1}, huge], name="src").map(lambda v: v["missing"], name="lookup") \
        .sink(CollectSink())
    error = failure(p)
    assert error.error_type == "KeyError"
    assert "step 'lookup' on record {'payload': 'xxxx" in error.message
    assert "x" * 300 not in error.message
    assert len(error.message) < 300
    assert error.message.endswith("...)")


def test_a_raising_timestamp_fn_names_the_source_step():
    p = Pipeline("stamps")
    p.from_collection([{"ts": 1}, {"ts": 2}, {"time": 3}], name="events", timestamp_fn=lambda e: e["ts"]) \
        .sink(CollectSink())
    error = failure(p)
    assert error.error_type == "KeyError"
    assert error.message == "'ts' (step 'events' on record {'time': 3})"


def test_a_timestamp_fn_returning_a_non_number_names_the_source_step():
    p = Pipeline("stamps")
    p.from_collection([{"ts": "noon"}], name="events", timestamp_fn=lambda e: e["ts"]).sink(CollectSink())
    error = failure(p)
    assert error.error_type == "ValueError"
    assert "step 'events' on record {'ts': 'noon'}" in error.message


def test_a_value_that_cannot_be_serialised_names_its_type_and_the_emitting_step():
    p = Pipeline("unsendable", parallelism=2)
    (p.from_collection([1, 2], name="src", parallelism=2).map(lambda x: {x}, name="to_set")
        .sink(CollectSink(), name="out"))  # parallelism 1: the sets must cross
    error = failure(p)
    assert error.error_type == "ValueTypeError"
    assert "a value of type builtins.set cannot be sent between tasks" in error.message
    assert "(emitted by step 'to_set')" in error.message


def test_a_value_that_cannot_be_serialised_crossing_a_group_by_shuffle():
    p = Pipeline("unsendable")
    (p.from_collection([1, 2], name="src").map(lambda x: frozenset([x]), name="to_set")
        .group_by(lambda s: len(s), name="by_size").fold(0, lambda a, s: a + 1, name="n")
        .sink(CollectSink(), name="out"))
    error = failure(p)
    assert error.error_type == "ValueTypeError"
    assert "builtins.frozenset cannot be sent between tasks" in error.message
    assert "emitted by step 'by_size'" in error.message  # the step the records leave the processor from
    assert "src+to_set+by_size" in error.where


def test_an_unsendable_value_that_never_crosses_a_shuffle_is_fine():
    out = []
    p = Pipeline("local-sets")
    p.from_collection([1, 2], name="src").map(lambda x: {x}, name="to_set").map(len, name="size") \
        .sink(CollectSink(out), name="out")
    run(p)
    assert out == [1, 1]


def write_jsonl_with_bad_line(path, count: int, bad: int, blank_every: int = 0, pad: int = 0) -> None:
    """``count`` lines (1-based numbering), line ``bad`` malformed; some blank lines and
    multi-byte characters so byte offsets and line numbers differ."""
    lines = []
    for n in range(1, count + 1):
        if n == bad:
            lines.append('{"n": %d, "broken": ' % n)
        elif blank_every and n % blank_every == 0:
            lines.append("")
        else:
            lines.append(json.dumps({"n": n, "text": "héllo wörld ☃" + "p" * pad}, ensure_ascii=False))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("parallelism", [1, 3])
@pytest.mark.parametrize("bad", [1, 17, 40, 66, 100])
def test_a_malformed_json_line_reports_the_file_and_line_number(tmp_path, parallelism, bad):
    source = tmp_path / "events.jsonl"
    write_jsonl_with_bad_line(source, 100, bad, blank_every=9)
    p = Pipeline("json")
    p.read_jsonl(str(source), parallelism=parallelism, name="read").sink(CollectSink(), name="out")
    error = failure(p)
    assert error.error_type == "ValueError"
    assert error.message.startswith(f"{source}:{bad}: not valid JSON (")
    assert f'{{"n": {bad}, "broken": ' in error.message
    assert "read" in error.where


@pytest.mark.parametrize("parallelism", [1, 3])
def test_a_malformed_json_line_past_the_first_read_chunk(tmp_path, parallelism):
    source = tmp_path / "big.jsonl"
    count = 3 * files.READ_CHUNK_BYTES // 500
    bad = count - 3
    write_jsonl_with_bad_line(source, count, bad, blank_every=101, pad=450)
    assert source.stat().st_size > 2 * files.READ_CHUNK_BYTES
    p = Pipeline("json")
    p.read_jsonl(str(source), parallelism=parallelism, name="read").sink(CollectSink(), name="out")
    error = failure(p)
    assert error.message.startswith(f"{source}:{bad}: not valid JSON")


@pytest.mark.parametrize("parallelism", [1, 3])
def test_well_formed_json_lines_are_read_once(tmp_path, parallelism):
    source = tmp_path / "events.jsonl"
    write_jsonl_with_bad_line(source, 100, bad=0, blank_every=9)
    out = []
    p = Pipeline("json")
    p.read_jsonl(str(source), parallelism=parallelism, name="read").sink(CollectSink(out), name="out")
    run(p)
    assert sorted(v["n"] for v in out) == [n for n in range(1, 101) if n % 9]


def test_a_raising_reduce_function_names_the_reduce_step_and_the_record():
    p = Pipeline("reduce")
    (p.from_collection([1, 2, "three", 4], name="src").group_by(lambda v: "all", name="k")
        .reduce(lambda a, b: a + b, name="add").sink(CollectSink(), name="out"))
    error = failure(p)
    assert error.error_type == "TypeError"
    assert "step 'add'" in error.message
    assert "on record 'three'" in error.message


def test_a_raising_fold_function_names_the_fold_step_and_the_record():
    p = Pipeline("fold")
    (p.from_collection([1, 2, "three", 4], name="src").group_by(lambda v: "all", name="k")
        .fold(0, lambda a, b: a + b, name="add").sink(CollectSink(), name="out"))
    error = failure(p)
    assert error.error_type == "TypeError"
    assert "step 'add'" in error.message
    assert "on record 'three'" in error.message


def test_a_raising_fold_function_names_the_fold_step():
    p = Pipeline("fold")
    (p.from_collection([1, 2, "three", 4], name="src").group_by(lambda v: "all", name="k")
        .fold(0, lambda a, b: a + b, name="add").sink(CollectSink(), name="out"))
    error = failure(p)
    assert error.error_type == "TypeError"
    assert "(step 'add'" in error.message and "unsupported operand" in error.message


def test_a_global_window_with_a_late_sink_runs():
    out = []
    p = Pipeline("global-late")
    (p.from_collection(["a", "b", "a"], name="src").group_by(lambda w: w, name="k")
        .window(GlobalWindows(), late_sink=CollectSink([])).count(name="n")
        .sink(CollectSink(out), name="out"))
    run(p)
    assert sorted((r.key, r.value) for r in out) == [("a", 2), ("b", 1)]


# --- late data -------------------------------------------------------------------------

#: Tumbling windows of 10 ms, allowed lateness 5 ms, one record per batch, so the
#: watermark after each record is its newest timestamp - 1:
#:   1, 5      -> window [0, 10)
#:   12        -> watermark 11 completes [0, 10): ON_TIME pane of 2
#:   3         -> late but within the lateness (11 < 9 + 5): LATE pane
#:   25        -> watermark 24 completes [10, 20) and expires both windows (24 >= 19 + 5)
#:   7, 15     -> too late: dropped and counted
#:   26        -> [20, 30) fires at the end of the input
LATE_EVENTS = [("k", t) for t in [1, 5, 12, 3, 25, 7, 15, 26]]


def late_pipeline(out: list, accumulation=Accumulation.DISCARDING, late_sink=None) -> Pipeline:
    p = Pipeline("late", config={"batch_records": 1})
    (p.from_collection(LATE_EVENTS, timestamp_fn=lambda e: e[1], name="src")
        .group_by(lambda e: e[0], name="k")
        .window(TumblingWindows(10), accumulation=accumulation, allowed_lateness_ms=5, late_sink=late_sink)
        .count(name="n").sink(CollectSink(out), name="out"))
    return p


def late_counts(engine) -> dict[str, int]:
    return {node.name: node.task.late_records for node in engine.nodes.values()}


@pytest.mark.parametrize("accumulation, late_pane", [(Accumulation.DISCARDING, 1), (Accumulation.ACCUMULATING, 3)])
def test_late_panes_and_dropped_records(inprocess, accumulation, late_pane):
    out = []
    engine = inprocess(late_pipeline(out, accumulation))
    engine.run()
    assert out == [
        WindowResult("k", 2, 0, 10, "on_time"),
        WindowResult("k", late_pane, 0, 10, "late"),
        WindowResult("k", 1, 10, 20, "on_time"),
        WindowResult("k", 2, 20, 30, "on_time"),
    ]
    assert [r.final for r in out] == [True, True, True, True]
    assert late_counts(engine) == {"src+k[0]": 0, "n+out[0]": 2}
    [aggregate] = [op for node in engine.nodes.values() for op in node.task.ops if hasattr(op, "late_records")]
    assert (aggregate.operator.late_dropped, aggregate.operator.late_side_output) == (2, 0)


def test_records_too_late_go_to_the_late_sink(inprocess):
    out, late = [], []
    engine = inprocess(late_pipeline(out, late_sink=CollectSink(late)))
    engine.run()
    assert late == [("k", 7), ("k", 15)]
    assert [(r.window_start, r.value, r.timing) for r in out] == [(0, 2, "on_time"), (0, 1, "late"),
                                                                  (10, 1, "on_time"), (20, 2, "on_time")]
    assert late_counts(engine)["n+out[0]"] == 2
    [aggregate] = [op for node in engine.nodes.values() for op in node.task.ops if hasattr(op, "late_records")]
    assert (aggregate.operator.late_dropped, aggregate.operator.late_side_output) == (0, 2)


def test_the_test_runner_uses_the_pipeline_batch_size_for_late_data():
    out = []
    run(late_pipeline(out))
    assert [(r.window_start, r.value, r.timing) for r in out] == [(0, 2, "on_time"), (0, 1, "late"),
                                                                  (10, 1, "on_time"), (20, 2, "on_time")]


def test_without_allowed_lateness_a_late_record_is_dropped(inprocess):
    out = []
    p = Pipeline("strict", config={"batch_records": 1})
    (p.from_collection([("k", t) for t in [1, 12, 3, 13]], timestamp_fn=lambda e: e[1], name="src")
        .group_by(lambda e: e[0], name="k").window(TumblingWindows(10)).count(name="n")
        .sink(CollectSink(out), name="out"))
    engine = inprocess(p)
    engine.run()
    assert [(r.window_start, r.value, r.timing) for r in out] == [(0, 1, "on_time"), (10, 2, "on_time")]
    assert late_counts(engine)["n+out[0]"] == 1


def test_out_of_order_within_the_bound_is_not_late(inprocess):
    out = []
    p = Pipeline("bounded", config={"batch_records": 1})
    (p.from_collection([("k", t) for t in [1, 12, 3, 9, 14, 25]], timestamp_fn=lambda e: e[1], name="src",
                       max_out_of_orderness_ms=10)
        .group_by(lambda e: e[0], name="k").window(TumblingWindows(10)).count(name="n")
        .sink(CollectSink(out), name="out"))
    engine = inprocess(p)
    engine.run()
    assert [(r.window_start, r.value, r.timing) for r in out] == [(0, 3, "on_time"), (10, 2, "on_time"),
                                                                  (20, 1, "on_time")]
    assert late_counts(engine)["n+out[0]"] == 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_none_is_a_key_like_any_other(seed):
    """Records keyed None meet in one task, as any key's do (not spread by their values)."""
    p = Pipeline("none_key", parallelism=2)
    out = CollectSink()
    (p.from_collection(list(range(100)), name="numbers", parallelism=2)
      .group_by(lambda x: None if x % 2 else "even", name="parity")
      .fold(0, lambda count, x: count + 1, name="count")
      .sink(out, name="out"))
    TestRunner(seed=seed).run(p)
    assert sorted((str(r.key), r.value) for r in out.values) == [("None", 50), ("even", 50)]
