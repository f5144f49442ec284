"""The planner, without a network: logical DSL steps -> processor DAG (chaining, hash
shuffles, map-side combine, runner checks), the JSON plan, and the DSL's build-time and
plan-time errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import gearbus
from gearbus import (
    Accumulation,
    AggregateFunction,
    CollectSink,
    Count,
    Fold,
    GlobalWindows,
    GraphError,
    Mean,
    Pipeline,
    SessionWindows,
    SlidingWindows,
    Task,
    Triggers,
    TumblingWindows,
)
from gearbus.api.graph import Application
from gearbus.artifact import load_local
from gearbus.runtime.chain import (
    ChainSourceTask,
    ChainTask,
    CombineOp,
    FilterOp,
    FlatMapOp,
    KeyByOp,
    MapOp,
    SinkOp,
    WindowAggregateOp,
)
from gearbus.planner import describe, plan
from tests.support.paths import REPO, WORDCOUNT


class Passthrough(Task):
    def on_next(self, record):
        self.emit(record.value)


def processors(app: Application) -> dict[str, gearbus.Processor]:
    return {p.name: p for p in app.graph.processors}


def edges(app: Application) -> set[tuple[str, str, str]]:
    return {(e.upstream.name, e.downstream.name, e.partitioner.describe()) for e in app.graph.edges}


def ops_of(processor) -> list:
    return processor.config["ops"]


def keyed(parallelism: int = 1, **kwargs) -> gearbus.GroupedStream:
    """A pipeline whose words go through map, flat_map and filter, then group_by."""
    p = Pipeline("keyed", parallelism=parallelism, **kwargs)
    return (p.from_collection(["a b", "c"], name="src")
            .map(str.lower, name="lower")
            .flat_map(str.split, name="words")
            .filter(bool, name="nonempty")
            .group_by(len, name="by_len"))


# --- chaining ------------------------------------------------------------------------


def test_source_map_filter_flat_map_and_sink_chain_into_one_processor():
    p = Pipeline("chain")
    (p.from_collection(["x y"], name="src").map(str.upper, name="up").filter(bool, name="some")
        .flat_map(str.split, name="words").sink(CollectSink(), name="out"))
    app = plan(p, "test")
    [only] = app.graph.processors
    assert only.name == "src+up+some+words+out"
    assert only.task_class is ChainSourceTask
    assert only.config["steps"] == ["src", "up", "some", "words", "out"]
    assert [type(op) for op in ops_of(only)] == [MapOp, FilterOp, FlatMapOp, SinkOp]
    assert [op.step for op in ops_of(only)] == ["up", "some", "words", "out"]
    assert app.graph.edges == []


def test_a_fan_out_ends_the_chain():
    p = Pipeline("fan-out")
    words = p.from_collection(["x"], name="src").map(str.upper, name="up")
    words.map(str.lower, name="low").sink(CollectSink(), name="out_low")
    words.filter(bool, name="keep").sink(CollectSink(), name="out_keep")
    app = plan(p, "test")
    assert set(processors(app)) == {"src+up", "low+out_low", "keep+out_keep"}
    assert edges(app) == {("src+up", "low+out_low", "CoLocationPartitioner"),
                          ("src+up", "keep+out_keep", "CoLocationPartitioner after keep")}
    assert [type(op).__name__ for op in ops_of(processors(app)["keep+out_keep"])] == ["SinkOp"]  # the filter runs at src+up's sender


def test_stateless_branches_of_a_split_run_at_the_senders_and_their_processors_go_away():
    """One stream split by kind, each branch stateless up to a keyed running total: the
    source's sender runs both branches and hashes for the total; no processor in between."""
    p = Pipeline("split", parallelism=2)
    events = p.from_collection([("a", 1), ("b", 2)], parallelism=2, name="events")
    left = events.filter(lambda e: e[0] == "a", name="only_a").map(lambda e: e[1], name="a_value")
    right = events.filter(lambda e: e[0] == "b", name="only_b").flat_map(lambda e: [e[1]] * 2, name="b_twice")
    (left.merge(right, name="both").group_by(lambda v: v % 2, name="parity")
        .stateful_map(lambda total, v: ((total or 0) + v,) * 2, name="total").sink(CollectSink(), 2, name="out"))
    app = plan(p, "test")
    assert set(processors(app)) == {"events", "total+out"}
    assert edges(app) == {("events", "total+out", "HashPartitioner after only_a, a_value, parity; "
                                                  "HashPartitioner after only_b, b_twice, parity")}


def test_a_stage_that_changes_the_parallelism_or_holds_state_stays_a_processor_its_filters_at_the_sender():
    p = Pipeline("stays", parallelism=2)
    events = p.from_collection(range(4), parallelism=2, name="events")
    events.filter(bool, name="nonzero").map(str, name="wide", parallelism=3).sink(CollectSink(), 3, name="out3")
    events.filter(bool, name="kept").sink(CollectSink(), 2, name="out")
    app = plan(p, "test")
    assert set(processors(app)) == {"events", "wide+out3", "kept+out"}
    assert edges(app) == {("events", "wide+out3", "ShufflePartitioner after nonzero"),
                          ("events", "kept+out", "CoLocationPartitioner after kept")}
    assert [type(op).__name__ for op in ops_of(processors(app)["kept+out"])] == ["SinkOp"]


def test_a_stage_read_over_two_branches_stays_so_its_steps_run_once_per_record():
    p = Pipeline("twice", parallelism=2)
    src = p.from_collection(range(4), parallelism=2, name="src")
    src.sink(CollectSink(), 2, name="raw")
    tagged = src.map(str, name="tag")
    tagged.merge(tagged.filter(bool, name="nonempty"), name="both").sink(CollectSink(), 2, name="out")
    app = plan(p, "test")
    assert "tag" in processors(app)
    assert edges(app) >= {("tag", "both+out", "CoLocationPartitioner; CoLocationPartitioner after nonempty")}


def test_a_filter_with_a_parallelism_of_its_own_runs_in_its_own_tasks():
    p = Pipeline("wider")
    p.from_collection(range(4), name="src").process(Passthrough, name="custom").filter(
        bool, parallelism=3, name="costly").sink(CollectSink(), 3, name="out")
    app = plan(p, "test")
    assert edges(app) >= {("custom", "costly+out", "ShufflePartitioner")}
    assert [type(op).__name__ for op in ops_of(processors(app)["costly+out"])] == ["FilterOp", "SinkOp"]


def test_a_parallelism_change_starts_a_new_processor_with_a_shuffle():
    p = Pipeline("wide", parallelism=2)
    p.from_collection(range(10), parallelism=2, name="src").map(str, name="text").sink(CollectSink(), name="out")
    app = plan(p, "test")
    named = processors(app)
    assert {n: q.parallelism for n, q in named.items()} == {"src+text": 2, "out": 1}
    assert named["out"].task_class is ChainTask
    assert edges(app) == {("src+text", "out", "ShufflePartitioner")}


def test_a_step_with_more_parallelism_also_gets_a_shuffle():
    p = Pipeline("widen")
    (p.from_collection(range(10), name="src").process(Passthrough, parallelism=3, name="custom")
        .sink(CollectSink(), 3, name="out"))
    assert edges(plan(p, "test")) == {("src", "custom", "ShufflePartitioner"),
                                      ("custom", "out", "CoLocationPartitioner")}


def test_equal_parallelism_gives_co_location():
    p = Pipeline("equal", parallelism=2)
    (p.from_collection(range(10), parallelism=2, name="src").process(Passthrough, name="custom")
        .sink(CollectSink(), 2, name="out"))
    app = plan(p, "test")
    assert {q.parallelism for q in app.graph.processors} == {2}
    assert edges(app) == {("src", "custom", "CoLocationPartitioner"), ("custom", "out", "CoLocationPartitioner")}


def test_a_custom_process_step_is_its_own_processor():
    p = Pipeline("custom")
    (p.from_collection(range(3), name="src").map(abs, name="before")
        .process(Passthrough, name="custom", factor=3)
        .map(abs, name="after").sink(CollectSink(), name="out"))
    app = plan(p, "test")
    named = processors(app)
    assert set(named) == {"src+before", "custom", "after+out"}
    custom = named["custom"]
    assert custom.task_class is Passthrough
    assert custom.config == {"factor": 3}
    assert edges(app) == {("src+before", "custom", "CoLocationPartitioner"),
                          ("custom", "after+out", "CoLocationPartitioner")}
    plan_json = {q["name"]: q for q in describe(app)["processors"]}
    assert plan_json["custom"] == {"id": custom.id, "name": "custom", "parallelism": 1, "task": "Passthrough",
                                   "steps": ["custom"], "operators": [], "combine": False}


def test_merge_makes_one_processor_fed_by_every_input():
    p = Pipeline("union", parallelism=2)
    a = p.from_collection([1], name="a", parallelism=2)
    b = p.from_collection([2], name="b")  # parallelism 1
    c = p.from_collection([3], name="c", parallelism=2).map(abs, name="c_abs")
    a.merge(b, c, name="all").map(str, name="text").sink(CollectSink(), name="out")
    app = plan(p, "test")
    named = processors(app)
    assert set(named) == {"a", "b", "c+c_abs", "all+text", "out"}
    assert named["all+text"].parallelism == 2  # the widest input
    assert edges(app) == {
        ("a", "all+text", "CoLocationPartitioner"),
        ("b", "all+text", "ShufflePartitioner"),
        ("c+c_abs", "all+text", "CoLocationPartitioner"),
        ("all+text", "out", "ShufflePartitioner"),
    }


# --- group_by, hash shuffles and the map-side combine ---------------------------------


@pytest.mark.parametrize("aggregate", [
    lambda g: g.count(name="agg"),
    lambda g: g.sum(len, name="agg"),
    lambda g: g.reduce(min, name="agg"),
    lambda g: g.aggregate(Mean(len), name="agg"),
    lambda g: g.aggregate(AggregateFunction(lambda: 0, lambda a, v: a + 1, lambda a, b: a + b), name="agg"),
    lambda g: g.window(GlobalWindows()).count(name="agg"),
], ids=["count", "sum", "reduce", "mean", "aggregate_function_with_merge", "explicit_global_window"])
def test_a_combinable_global_aggregation_gets_a_map_side_combine(aggregate):
    grouped = keyed(parallelism=2)
    aggregate(grouped).sink(CollectSink(), name="out")
    app = plan(grouped.pipeline, "test")
    named = processors(app)
    assert set(named) == {"src+lower+words+nonempty+by_len", "agg", "out"}
    upstream = named["src+lower+words+nonempty+by_len"]
    [combine] = ops_of(upstream)  # the value steps are fused into the combine
    assert isinstance(combine, CombineOp)
    assert combine.step == "by_len" and combine.key_fn is len
    assert [(type(v), v.step) for v in combine.value_ops] == [(MapOp, "lower"), (FlatMapOp, "words"),
                                                              (FilterOp, "nonempty")]
    [window] = ops_of(named["agg"])
    assert isinstance(window, WindowAggregateOp) and window.partial_input
    assert named["agg"].parallelism == 2
    assert edges(app) == {("src+lower+words+nonempty+by_len", "agg", "HashPartitioner"),
                          ("agg", "out", "ShufflePartitioner")}
    described = {q["name"]: q for q in describe(app)["processors"]}
    assert described["src+lower+words+nonempty+by_len"]["operators"] == ["MapOp", "FlatMapOp", "FilterOp",
                                                                         "CombineOp"]
    assert described["src+lower+words+nonempty+by_len"]["combine"] is True
    assert described["agg"]["combine"] is False


def test_the_combine_keeps_steps_that_are_not_value_steps_in_front_of_it():
    p = Pipeline("two-stage")
    (p.from_collection(["a"], name="src").group_by(len, name="k1").count(name="c1")
        .map(lambda r: r.value, name="v").group_by(abs, name="k2").count(name="c2")
        .sink(CollectSink(), name="out"))
    app = plan(p, "test")
    named = processors(app)
    assert [type(op) for op in ops_of(named["c1+v+k2"])] == [WindowAggregateOp, CombineOp]
    assert [type(v) for v in ops_of(named["c1+v+k2"])[1].value_ops] == [MapOp]
    assert [type(op) for op in ops_of(named["src+k1"])] == [CombineOp]
    assert ops_of(named["src+k1"])[0].value_ops == []


@pytest.mark.parametrize("aggregate", [
    lambda g: g.fold(0, lambda a, v: a + 1, name="agg"),
    lambda g: g.aggregate(AggregateFunction(lambda: 0, lambda a, v: a + 1), name="agg"),  # no merge
    lambda g: g.window(TumblingWindows(1000)).count(name="agg"),
    lambda g: g.window(SlidingWindows(1000, 500)).count(name="agg"),
    lambda g: g.window(SessionWindows(1000)).count(name="agg"),
    lambda g: g.window(GlobalWindows(), trigger=Triggers.repeat(Triggers.count(5))).count(name="agg"),
], ids=["fold", "aggregate_function_without_merge", "tumbling", "sliding", "session", "early_trigger"])
def test_no_combine_when_it_would_not_be_exact(aggregate):
    grouped = keyed()
    aggregate(grouped).sink(CollectSink(), name="out")
    app = plan(grouped.pipeline, "test")
    named = processors(app)
    upstream = named["src+lower+words+nonempty+by_len"]
    assert [type(op) for op in ops_of(upstream)] == [MapOp, FlatMapOp, FilterOp, KeyByOp]
    assert not any(isinstance(op, CombineOp) for q in app.graph.processors for op in q.config.get("ops", []))
    [window] = ops_of(named["agg+out"])[:1]
    assert isinstance(window, WindowAggregateOp) and not window.partial_input
    assert edges(app) == {("src+lower+words+nonempty+by_len", "agg+out", "HashPartitioner")}
    assert not any(q["combine"] for q in describe(app)["processors"])


def test_no_combine_when_the_grouped_stream_feeds_two_aggregations():
    grouped = keyed()
    grouped.count(name="n").sink(CollectSink(), name="out_n")
    grouped.sum(len, name="total").sink(CollectSink(), name="out_total")
    app = plan(grouped.pipeline, "test")
    assert [type(op) for op in ops_of(processors(app)["src+lower+words+nonempty+by_len"])][-1] is KeyByOp
    assert edges(app) == {("src+lower+words+nonempty+by_len", "n+out_n", "HashPartitioner"),
                          ("src+lower+words+nonempty+by_len", "total+out_total", "HashPartitioner")}


def test_group_by_parallelism_sets_the_aggregate_processor_parallelism():
    p = Pipeline("sized", parallelism=2)
    (p.from_collection(range(10), name="src", parallelism=2).group_by(abs, parallelism=5, name="k")
        .count(name="n").map(str, name="text").sink(CollectSink(), name="out"))
    app = plan(p, "test")
    assert {q.name: q.parallelism for q in app.graph.processors} == {"src+k": 2, "n+text": 5, "out": 1}
    assert edges(app) == {("src+k", "n+text", "HashPartitioner"), ("n+text", "out", "ShufflePartitioner")}


def test_the_aggregate_processor_defaults_to_the_pipeline_parallelism():
    p = Pipeline("default", parallelism=3)
    p.from_collection(range(10), name="src").group_by(abs, name="k").count(name="n").sink(CollectSink(), 3,
                                                                                         name="out")
    assert {q.name: q.parallelism for q in plan(p, "test").graph.processors} == {"src+k": 1, "n+out": 3}


def test_combine_keys_comes_from_the_pipeline_config():
    grouped = keyed(config={"combine_keys": 7})
    grouped.count(name="agg").sink(CollectSink(), name="out")
    [combine] = ops_of(processors(plan(grouped.pipeline, "test"))["src+lower+words+nonempty+by_len"])
    assert combine.max_keys == 7


# --- the JSON plan ---------------------------------------------------------------------


WORDCOUNT_PLAN = {
    "name": "wordcount",
    "processors": [
        {"id": 0, "name": "read+split+by_word", "parallelism": 2, "task": "ChainSourceTask",
         "steps": ["read", "split", "by_word"], "operators": ["FlatMapOp", "CombineOp"], "combine": True},
        {"id": 1, "name": "count+format", "parallelism": 2, "task": "ChainTask",
         "steps": ["count", "format"], "operators": ["WindowAggregateOp", "MapOp"], "combine": False},
        {"id": 2, "name": "write", "parallelism": 1, "task": "ChainTask",
         "steps": ["write"], "operators": ["SinkOp"], "combine": False},
    ],
    "edges": [
        {"from": 0, "to": 1, "partitioner": "HashPartitioner"},
        {"from": 1, "to": 2, "partitioner": "ShufflePartitioner"},
    ],
    "config": {"combine_keys": 100_000, "executors": 2},
}


def wordcount_args(tmp_path) -> list[str]:
    source = tmp_path / "in.txt"
    source.write_text("a b a\nc\n", encoding="utf-8")
    return ["--input", str(source), "--output", str(tmp_path / "out.jsonl")]


def wordcount_plan(tmp_path) -> dict:
    """WORDCOUNT_PLAN with the files wordcount_args name: read by step read, written by write."""
    read, count, write = WORDCOUNT_PLAN["processors"]
    return {**WORDCOUNT_PLAN, "processors": [{**read, "files": {"read": str(tmp_path / "in.txt")}}, count,
                                             {**write, "files": {"write": str(tmp_path / "out.jsonl")}}]}


@pytest.mark.parametrize("runner", ["test", "local", "cluster"])
def test_the_plan_of_the_wordcount_example(tmp_path, runner):
    described = describe(load_local(WORDCOUNT, wordcount_args(tmp_path), runner))
    assert described == wordcount_plan(tmp_path)
    assert json.loads(json.dumps(described)) == described  # plain JSON


def test_the_plan_follows_the_example_arguments(tmp_path):
    args = wordcount_args(tmp_path) + ["--parallelism", "3", "--combine-keys", "10"]
    described = describe(load_local(WORDCOUNT, args, "local"))
    assert [q["parallelism"] for q in described["processors"]] == [3, 3, 1]
    assert described["config"] == {"combine_keys": 10, "executors": 3}


def test_gearbus_plan_prints_the_same_json(tmp_path):
    args = wordcount_args(tmp_path)
    done = subprocess.run([sys.executable, "-m", "gearbus.cli", "plan", WORDCOUNT, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == wordcount_plan(tmp_path)


def test_gearbus_plan_reports_a_plan_error_naming_the_step(tmp_path):
    app = tmp_path / "collecting.py"
    app.write_text(
        "from gearbus import CollectSink, Pipeline\n"
        "def application(args):\n"
        "    p = Pipeline('collecting')\n"
        "    p.from_collection([1, 2]).map(abs, name='absolute').sink(CollectSink(), name='collected')\n"
        "    return p\n"
    )
    done = subprocess.run([sys.executable, "-m", "gearbus.cli", "plan", "--runner", "local", str(app)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "'collected'" in done.stderr and "CollectSink" in done.stderr and "test" in done.stderr
    done = subprocess.run([sys.executable, "-m", "gearbus.cli", "plan", "--runner", "test", str(app)], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["processors"][0]["steps"] == ["collection", "absolute", "collected"]


# --- build-time errors --------------------------------------------------------------


def test_duplicate_step_names_are_an_error_naming_the_step():
    p = Pipeline("dupes")
    src = p.from_collection([1], name="src")
    src.map(abs, name="same")
    with pytest.raises(GraphError, match=r"duplicate step name 'same'"):
        src.filter(bool, name="same")
    with pytest.raises(GraphError, match=r"duplicate step name 'src'"):
        p.from_collection([2], name="src")
    with pytest.raises(GraphError, match=r"duplicate step name 'same'"):
        src.group_by(abs, name="same")
    with pytest.raises(GraphError, match=r"duplicate step name 'same'"):
        src.group_by(abs, name="k").count(name="same")
    with pytest.raises(GraphError, match=r"duplicate step name 'same'"):
        src.sink(CollectSink(), name="same")
    assert [s.name for s in p.steps] == ["src", "same", "k"]  # nothing half-added


@pytest.mark.parametrize("call, what", [
    (lambda s: s.window(TumblingWindows(10)), "window"),
    (lambda s: s.reduce(min), "reduce"),
    (lambda s: s.count(), "count"),
    (lambda s: s.aggregate(Count()), "aggregate"),
    (lambda s: s.sum(), "sum"),
    (lambda s: s.fold(0, min), "fold"),
])
def test_aggregations_need_a_keyed_stream(call, what):
    p = Pipeline("unkeyed")
    stream = p.from_collection([1], name="src").map(abs, name="absolute")
    with pytest.raises(GraphError, match=rf"{what}.*after step 'absolute' needs a keyed stream: call group_by"):
        call(stream)


@pytest.mark.parametrize("call", [
    lambda s: s.map(5, name="bad"),
    lambda s: s.flat_map("split", name="bad"),
    lambda s: s.filter(3, name="bad"),
    lambda s: s.group_by([], name="bad"),
])
def test_a_function_that_is_not_callable_is_an_error_naming_the_step(call):
    p = Pipeline("uncallable")
    with pytest.raises(GraphError, match=r"step 'bad': .* is not callable"):
        call(p.from_collection([1], name="src"))


def test_a_timestamp_fn_that_is_not_callable_is_an_error_naming_the_source():
    with pytest.raises(GraphError, match=r"step 'events': 12 is not callable"):
        Pipeline("p").from_collection([1], name="events", timestamp_fn=12)


def test_a_function_without_a_name_is_reported_under_the_default_step_name():
    p = Pipeline("uncallable")
    with pytest.raises(GraphError, match=r"step 'map': 5 is not callable"):
        p.from_collection([1]).map(5)


@pytest.mark.parametrize("call", [
    lambda g: g.reduce(5, name="bad"),
    lambda g: g.fold(0, "add", name="bad"),
    lambda g: g.sum(7, name="bad"),
], ids=["reduce", "fold", "sum"])
def test_an_aggregation_function_that_is_not_callable_is_an_error_naming_the_step(call):
    p = Pipeline("uncallable")
    with pytest.raises(GraphError, match=r"'bad'.*not callable"):
        call(p.from_collection([1], name="src").group_by(abs, name="k"))


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2"])
def test_a_bad_parallelism_is_an_error_naming_the_step(bad):
    p = Pipeline("sizes")
    src = p.from_collection([1], name="src")
    with pytest.raises(GraphError, match=rf"step 'by_abs': parallelism must be an integer >= 1, got {bad!r}"):
        src.group_by(abs, parallelism=bad, name="by_abs")
    with pytest.raises(GraphError, match=r"step 'custom': parallelism must be an integer >= 1"):
        src.process(Passthrough, parallelism=bad, name="custom")
    with pytest.raises(GraphError, match=r"step 'out': parallelism must be an integer >= 1"):
        src.sink(CollectSink(), bad, name="out")
    with pytest.raises(GraphError, match=r"step 'other': parallelism must be an integer >= 1"):
        p.from_collection([1], name="other", parallelism=bad)
    with pytest.raises(GraphError, match=r"pipeline 'wide': parallelism must be an integer >= 1"):
        Pipeline("wide", parallelism=bad)
    assert [s.name for s in p.steps] == ["src"]


def test_a_pipeline_needs_a_source_and_a_sink():
    with pytest.raises(GraphError, match=r"pipeline 'empty' has no source"):
        plan(Pipeline("empty"), "test")
    p = Pipeline("nowhere")
    p.from_collection([1], name="src").map(abs, name="absolute")
    with pytest.raises(GraphError, match=r"pipeline 'nowhere' has no sink"):
        plan(p, "test")


def test_a_fold_over_session_windows_fails_at_plan_time_naming_the_step():
    p = Pipeline("sessions")
    (p.from_collection([1], name="src").group_by(abs, name="k").window(SessionWindows(1000))
        .fold(0, lambda a, v: a + v, name="folded").sink(CollectSink(), name="out"))  # builds fine
    for runner in ("test", "local", "cluster"):
        with pytest.raises(GraphError, match=r"step 'folded': SessionWindows.*merges windows.*not combinable"):
            plan(p, runner)


@pytest.mark.parametrize("window, message", [
    (lambda g: g.window("ten seconds"), r"assigner must be a WindowAssigner"),
    (lambda g: g.window(TumblingWindows(10), allowed_lateness_ms=-5), r"allowed_lateness_ms must be >= 0"),
    (lambda g: g.window(TumblingWindows(10), allowed_lateness_ms=2.5), r"allowed_lateness_ms must be an int"),
    (lambda g: g.window(TumblingWindows(10), accumulation="discarding"), r"accumulation must be an Accumulation"),
    (lambda g: g.window(TumblingWindows(10), trigger=Triggers.count(5)), r"unsupported trigger"),
], ids=["assigner", "negative_lateness", "float_lateness", "accumulation", "trigger"])
def test_an_invalid_window_argument_fails_at_plan_time_naming_the_step(window, message):
    p = Pipeline("windows")
    window(p.from_collection([1], name="src").group_by(abs, name="k")).count(name="counted").sink(CollectSink())
    with pytest.raises(GraphError, match=rf"step 'counted': {message}"):
        plan(p, "test")


def test_invalid_window_sizes_fail_where_the_window_is_made():
    with pytest.raises(ValueError, match="size_ms must be >= 1"):
        TumblingWindows(0)
    with pytest.raises(ValueError, match="slide_ms .* must not exceed size_ms"):
        SlidingWindows(10, 20)
    with pytest.raises(ValueError, match="gap_ms must be an int"):
        SessionWindows("30s")
    with pytest.raises(ValueError, match="positive int"):
        Triggers.count(0)


def test_a_late_sink_must_be_a_data_sink():
    grouped = Pipeline("late").from_collection([1], name="src").group_by(abs, name="k")
    with pytest.raises(GraphError, match=r"window after step 'k': late_sink must be a gearbus DataSink"):
        grouped.window(TumblingWindows(10), late_sink=[])


def test_connectors_and_tasks_are_type_checked():
    p = Pipeline("types")
    with pytest.raises(GraphError, match=r"source events: \[1\] is not a gearbus DataSource"):
        p.source([1], name="events")
    src = p.from_collection([1], name="src")
    with pytest.raises(GraphError, match=r"sink out: .* is not a gearbus DataSink"):
        src.sink([], name="out")
    with pytest.raises(GraphError, match=r"process custom: .* is not a gearbus Task subclass"):
        src.process(object, name="custom")
    with pytest.raises(GraphError, match=r"aggregate agg: .* is not a gearbus Aggregator"):
        src.group_by(abs, name="k").aggregate(len, name="agg")


@pytest.mark.parametrize("runner", ["local", "cluster"])
def test_collect_sink_is_refused_by_other_runners_at_plan_time(runner):
    p = Pipeline("collect")
    p.from_collection([1], name="src").map(abs, name="absolute").sink(CollectSink(), name="collected")
    with pytest.raises(GraphError) as failure:
        plan(p, runner)
    assert str(failure.value) == (f"step 'collected' (CollectSink) cannot run on the {runner} runner; "
                                  "it runs on: test")
    assert plan(p, "test").graph.processors[0].name == "src+absolute+collected"


@pytest.mark.parametrize("runner", ["local", "cluster"])
def test_collect_sink_as_a_late_sink_is_refused_by_other_runners_at_plan_time(runner, tmp_path):
    p = Pipeline("late")
    (p.from_collection([1], name="src").group_by(abs, name="k")
        .window(TumblingWindows(10), late_sink=CollectSink()).count(name="counted")
        .write_jsonl(str(tmp_path / "out.jsonl"), name="write"))
    with pytest.raises(GraphError, match=r"'counted'.*CollectSink.*test"):
        plan(p, runner)


def test_an_unknown_runner_is_an_error():
    p = Pipeline("p")
    p.from_collection([1]).sink(CollectSink())
    with pytest.raises(GraphError, match=r"unknown runner 'spark'; expected one of test, local, cluster"):
        plan(p, "spark")


def test_cycles_cannot_be_expressed_steps_only_take_existing_streams():
    """Each DSL step is made from a stream that already exists, so its inputs are always
    earlier steps and the logical graph is acyclic by construction; a stream of another
    pipeline (the only other thing one could pass) is refused."""
    p = Pipeline("acyclic")
    a = p.from_collection([1], name="a")
    b = a.map(abs, name="b")
    c = p.from_collection([2], name="c").merge(b, name="c_and_b")
    c.merge(a, b, name="all").group_by(abs, name="k").count(name="n").sink(CollectSink(), name="out")
    position = {step: i for i, step in enumerate(p.steps)}
    for step in p.steps:
        assert all(position[i] < position[step] for i in step.inputs), step
    other = Pipeline("other").from_collection([3], name="x")
    with pytest.raises(GraphError, match="can only merge streams of the same pipeline"):
        b.merge(other, name="mixed")
    with pytest.raises(GraphError, match="can only merge streams of the same pipeline"):
        b.merge(p.steps[0], name="not_a_stream")
    app = plan(p, "test")
    ids = {q.name: q.id for q in app.graph.processors}
    assert all(ids[e.upstream.name] < ids[e.downstream.name] for e in app.graph.edges)


# --- default step names ---------------------------------------------------------------


def split_words(line):
    return line.split()


def test_default_names_come_from_the_function_or_the_kind():
    p = Pipeline("names")
    src = p.from_collection(["a b"])
    words = src.flat_map(str.split)
    words.map(str.upper).map(lambda w: w).map(lambda w: w).filter(lambda w: True).flat_map(split_words) \
        .sink(CollectSink())
    assert [s.name for s in p.steps] == ["collection", "split", "upper", "map", "map_1", "filter", "split_words",
                                         "collect"]


def test_default_names_are_made_unique_with_a_suffix():
    p = Pipeline("names")
    src = p.from_collection(["a"], name="src")
    src.map(str.upper).map(str.upper).map(str.upper, name="upper_3").map(str.upper).sink(CollectSink(), name="o")
    assert [s.name for s in p.steps] == ["src", "upper", "upper_1", "upper_3", "upper_2", "o"]
    src.filter(bool, name="filter")
    src.filter(lambda v: v).sink(CollectSink(), name="o2")
    assert p.steps[-2].name == "filter_1"


def test_default_names_of_group_by_and_aggregations():
    p = Pipeline("names")
    p.from_collection(["a"]).group_by(len).count().sink(CollectSink())
    assert [s.name for s in p.steps] == ["collection", "group_by", "count", "collect"]
    p = Pipeline("names")
    g = p.from_collection(["a"], name="src").group_by(len, name="k")
    g.sum().sink(CollectSink(), name="o1")
    g.reduce(min).sink(CollectSink(), name="o2")
    g.fold(0, min).sink(CollectSink(), name="o3")
    g.aggregate(Mean()).sink(CollectSink(), name="o4")
    assert [s.name for s in p.steps if s.kind == "aggregate"] == ["sum", "reduce", "fold", "mean"]


def test_default_names_of_every_kind_are_made_unique():
    p = Pipeline("names")
    a = p.from_collection(["a"])
    b = p.from_collection(["b"])
    merged = a.merge(b).merge(a)
    merged.group_by(len).count().sink(CollectSink())
    merged.group_by(len).count().sink(CollectSink())
    merged.process(Passthrough).process(Passthrough).sink(CollectSink())
    names = [s.name for s in p.steps]
    assert len(set(names)) == len(names)
    assert names[:4] == ["collection", "collection_1", "merge", "merge_1"]


def test_accumulation_modes_are_accepted_by_the_planner():
    p = Pipeline("modes")
    g = p.from_collection([1], name="src").group_by(abs, name="k")
    g.window(TumblingWindows(10), accumulation=Accumulation.ACCUMULATING).count(name="acc").sink(CollectSink(),
                                                                                                 name="o1")
    g.window(TumblingWindows(10), trigger=Triggers.watermark()).count(name="wm").sink(CollectSink(), name="o2")
    app = plan(p, "test")
    assert {q.name for q in app.graph.processors} == {"src+k", "acc+o1", "wm+o2"}


def test_fold_aggregator_is_not_combinable():
    assert not Fold(0, min).combinable and Count().combinable and Mean().combinable
