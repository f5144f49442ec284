"""Intermediate streams in the plan (Samza's ExecutionPlanner): which edges become streams,
their names and partition counts by Samza's rule, the stages they cut the app into, what
``gearbus plan`` shows, and the errors."""

from __future__ import annotations

import pytest

from gearbus import CollectSink, GraphError, Pipeline, TumblingWindows
from gearbus.api.partitioners import HashPartitioner, IntermediateStream
from gearbus.connectors.intermediate import partitions_read
from gearbus.planner import describe, plan, size_streams, stages
from gearbus.runners import TestRunner
from gearbus.stages import stage_app, stage_count, stream_specs

pytestmark = pytest.mark.unit


def running_total(total, value):
    total = (total or 0) + 1
    return total, (value, total)


def chain(partitions=None, config=None) -> Pipeline:
    """src (2) -> first (stream) -> totals (4) -> second (stream) -> count (3) -> out."""
    p = Pipeline("chain", config=config)
    (p.from_collection(range(20), parallelism=2, name="src")
        .repartition(lambda v: v % 5, partitions=partitions, name="first")
        .stateful_map(running_total, name="totals", parallelism=4)
        .repartition(lambda pair: pair[0] % 3, name="second")
        .count(name="count").sink(CollectSink(), name="out"))
    return p


def streams(pipeline: Pipeline) -> dict[str, tuple[int, str, str]]:
    app = plan(pipeline, "test")
    names = {p.id: p.name for p in app.graph.processors}
    return {s["edge"]: (s["partitions"], names[s["from"]], names[s["to"]]) for s in describe(app)["streams"]}


def test_a_chain_sizes_each_stream_by_the_larger_parallelism_on_its_sides():
    """count gets the pipeline's parallelism (1) unless asked: second joins totals (4) and count."""
    p = chain()
    p.parallelism = 3
    assert streams(p) == {"first": (4, "src+first", "totals+second"), "second": (4, "totals+second", "count")}


def test_the_count_asked_for_wins_then_the_configured_default():
    assert streams(chain(partitions=6))["first"][0] == 6
    configured = streams(chain(config={"intermediate_stream_partitions": 5}))
    assert configured == {"first": (5, "src+first", "totals+second"), "second": (5, "totals+second", "count+out")}
    assert streams(chain(partitions=7, config={"intermediate_stream_partitions": 5}))["first"][0] == 7


def joined(left: int, right: int, config: dict) -> Pipeline:
    p = Pipeline("joined", parallelism=2, config=config)
    lhs = p.from_collection(range(10), name="left", parallelism=left, timestamp_fn=lambda v: v)
    rhs = p.from_collection(range(10), name="right", parallelism=right, timestamp_fn=lambda v: v)
    lhs.join(rhs, lambda v: v % 3, lambda v: v % 3, TumblingWindows(5), name="pairs").sink(CollectSink(), name="out")
    return p


def test_the_inputs_of_a_join_get_one_count_the_larger():
    """Inputs of 4 and 8 tasks into a join of 2: each stream alone would get 4 and 8; both get 8."""
    assert streams(joined(4, 8, {"intermediate_streams": "all"})) == {
        "pairs.left": (8, "left", "pairs"), "pairs.right": (8, "right", "pairs")}
    assert streams(joined(4, 8, {"intermediate_streams": "all", "intermediate_stream_partitions": 3})) == {
        "pairs.left": (3, "left", "pairs"), "pairs.right": (3, "right", "pairs")}


def test_size_streams_alone_applies_the_join_rule_after_each_streams_own_count():
    from gearbus.planner import Layout, chain as chain_pass, connect, key_join_inputs, place_operators
    layout = Layout(joined(4, 8, {"intermediate_streams": "all"}))
    for run in (chain_pass, connect, place_operators, key_join_inputs):
        run(layout)
    (_, left), (_, right) = layout.segments[2].inputs
    assert (left.partitions, right.partitions) == (0, 0)  # sized by this pass only
    size_streams(layout)
    assert (left.stream, left.partitions, right.stream, right.partitions) == (
        "gearbus_joined_pairs_left", 8, "gearbus_joined_pairs_right", 8)


def test_intermediate_streams_all_makes_every_shuffle_a_stream_but_via_bus_stays_on_the_bus():
    p = Pipeline("all", config={"intermediate_streams": "all"})
    words = p.from_collection(["a b"], name="src").flat_map(str.split, name="split")
    words.group_by(len, name="by_len").count(name="lengths").sink(CollectSink(), name="out_lengths")
    words.repartition(str.lower, via="bus", name="by_word").count(name="words").sink(CollectSink(), name="out_words")
    app = plan(p, "test")
    shuffles = {e.downstream.name: e.partitioner for e in app.graph.edges if isinstance(e.partitioner, HashPartitioner)}
    assert type(shuffles["lengths+out_lengths"]) is IntermediateStream
    assert type(shuffles["words+out_words"]) is HashPartitioner


def test_stages_are_cut_at_streams_and_the_plan_shows_them():
    app = plan(chain(), "test")
    ids = {p.name: p.id for p in app.graph.processors}
    assert stages(app) == [[ids["src+first"]], [ids["totals+second"]], [ids["count+out"]]]
    shown = describe(app)
    assert [p["stage"] for p in shown["processors"]] == [0, 1, 2]
    assert shown["stages"] == [{"stage": 0, "processors": [0]}, {"stage": 1, "processors": [1]},
                               {"stage": 2, "processors": [2]}]
    first = shown["streams"][0]
    assert first == {"name": "gearbus_chain_first", "subjects": "gearbus_chain_first.*", "partitions": 4,
                     "edge": "first", "from": 0, "to": 1, "from_stage": 0, "to_stage": 1}
    assert shown["edges"][0]["partitioner"] == "IntermediateStream gearbus_chain_first (4 partitions)"


def test_a_plan_without_streams_shows_no_stages():
    p = Pipeline("plain")
    p.from_collection(range(3), name="src").group_by(str).count(name="count").sink(CollectSink(), name="out")
    assert {"stages", "streams"}.isdisjoint(describe(plan(p, "test")))


def test_stream_names_hold_only_what_jetstream_takes():
    p = Pipeline("my app.v2")
    p.from_collection(range(3), name="src").repartition(str, name="by text").count(name="n").sink(CollectSink())
    assert streams(p)  # planned
    assert describe(plan(p, "test"))["streams"][0]["name"] == "gearbus_my_app_v2_by_text"


def test_a_stream_that_would_not_separate_stages_is_refused():
    """One path through a stream, another over the bus into the same merge: one stage."""
    p = Pipeline("diamond")
    src = p.from_collection(range(3), name="src")
    totals = src.repartition(lambda v: v % 2, name="by_parity").stateful_map(running_total, name="totals")
    totals.merge(src.map(lambda v: (v, 0), name="zeros"), name="both").sink(CollectSink(), name="out")
    with pytest.raises(GraphError, match="'gearbus_diamond_by_parity'.*joined over the bus as well"):
        plan(p, "test")


@pytest.mark.parametrize("kwargs, message", [
    ({"via": "kafka"}, "via must be one of 'jetstream', 'bus', got 'kafka'"),
    ({"partitions": 0}, "partitions must be an integer from 1 to 128"),
    ({"partitions": 129}, "partitions must be an integer from 1 to 128"),
    ({"partitions": True}, "partitions must be an integer"),
])
def test_bad_repartition_arguments_are_refused_at_build_time(kwargs, message):
    p = Pipeline("bad")
    with pytest.raises(GraphError, match=message):
        p.from_collection(range(3), name="src").repartition(str, name="r", **kwargs)


@pytest.mark.parametrize("config, message", [
    ({"intermediate_streams": "some"}, "intermediate_streams must be 'all' or 'none'"),
    ({"intermediate_stream_partitions": 0}, "intermediate_stream_partitions must be an integer from 1 to 128"),
])
def test_bad_stream_config_is_refused_at_plan_time(config, message):
    with pytest.raises(GraphError, match=message):
        plan(chain(config=config), "test")


def collected(pipeline: Pipeline) -> list:
    TestRunner().run(pipeline)
    return sorted(next(s for s in pipeline.steps if s.name == "out").data_sink.values)


def test_the_test_runner_runs_the_stages_as_one_with_the_streams_as_shuffles():
    def bus():
        p = Pipeline("chain")
        (p.from_collection(range(20), parallelism=2, name="src").repartition(lambda v: v % 5, via="bus", name="first")
            .stateful_map(running_total, name="totals", parallelism=4)
            .repartition(lambda pair: pair[0] % 3, via="bus", name="second")
            .count(name="count").sink(CollectSink(), name="out"))
        return p
    assert collected(chain()) == collected(bus()) != []


def stage_layout(app) -> list[tuple[str, int, str, list[str]]]:
    """Each processor of a stage's app: name, parallelism, what reads or writes a stream."""
    out = []
    for p in app.graph.processors:
        source = type(p.data_source).__name__ if p.data_source else ""
        ops = [type(op).__name__ for op in p.config.get("ops", []) if type(op).__name__ == "StreamWriteOp"]
        out.append((p.name, p.parallelism, source, ops))
    return out


def test_each_stage_reads_its_streams_in_its_own_tasks_or_through_a_reader_per_partition():
    p = chain()
    p.parallelism = 3
    app = plan(p, "test")
    assert stage_count(app) == 3
    first, second, third = (stage_app(app, n) for n in range(3))
    assert stage_layout(first) == [("src+first", 2, "CollectionSource", ["StreamWriteOp"])]
    # 4 partitions, 4 tasks: each task reads its own partition and writes the next stream
    assert stage_layout(second) == [("totals+second", 4, "StreamReader", ["StreamWriteOp"])]
    # 4 partitions, 3 tasks: a reader task per partition, hash-partitioned into count
    assert stage_layout(third) == [("gearbus_chain_second reader", 4, "StreamReader", []), ("count", 3, "", []),
                                   ("out", 1, "", [])]
    assert [type(e.partitioner).__name__ for e in third.graph.edges] == ["HashPartitioner", "ShufflePartitioner"]
    assert [s.config["stage"] for s in (first, second, third)] == [0, 1, 2]
    assert [(s.name, s.partitions, s.from_stage, s.to_stage) for s in stream_specs(app)] == [
        ("gearbus_chain_first", 4, 0, 1), ("gearbus_chain_second", 4, 1, 2)]
    with pytest.raises(GraphError, match="has 3 stage"):
        stage_app(app, 3)


def test_a_join_of_two_streams_reads_both_in_its_own_tasks():
    app = plan(joined(4, 8, {"intermediate_streams": "all"}), "test")
    assert stage_count(app) == 3  # each side's source, and the join
    processor, _ = stage_app(app, 2).graph.processors
    assert (processor.name, type(processor.data_source).__name__) == ("pairs", "StreamReader")
    assert sorted(s.partitions for s in processor.data_source.streams) == [8, 8]


def test_partitions_are_read_by_one_task_each_and_only_when_they_divide():
    assert [partitions_read(i, 2, 4) for i in range(2)] == [[0, 1], [2, 3]]
    assert [partitions_read(i, 4, 4) for i in range(4)] == [[0], [1], [2], [3]]
    for partitions, tasks in ((8, 2), (6, 3), (128, 4), (5, 1)):
        read = [p for i in range(tasks) for p in partitions_read(i, tasks, partitions)]
        assert sorted(read) == list(range(partitions))
    with pytest.raises(ValueError, match="multiple of the readers"):
        partitions_read(0, 3, 4)


def test_a_raising_key_function_fails_the_app_naming_the_step_and_the_record():
    p = Pipeline("raising")
    (p.from_collection([1, 0, 2], name="src").repartition(lambda v: 1 // v, via="bus", name="inverse")
        .count(name="count").sink(CollectSink(), name="out"))
    result = TestRunner().run(p, raise_on_failure=False)
    assert result.state == "FAILED" and result.error.error_type == "ZeroDivisionError"
    assert "step 'inverse' on record 0" in result.error.message


def test_a_stream_message_carries_its_writer_its_watermark_and_records_as_they_were():
    from gearbus.api.task import Record
    from gearbus.connectors.intermediate import decode, encode

    records = [Record(("w", 1), 5, "w"), Record({"n": [1, 2]}, 7, ("k", 2)), Record(None, 9, None)]
    assert decode(encode(1, 3, 6, records)) == (1, 3, 6, records)
    assert decode(encode(0, 2, 2**63 - 1, [])) == (0, 2, 2**63 - 1, [])


def test_a_processor_that_reads_its_stream_itself_keeps_its_source_state_apart_from_its_steps():
    from gearbus.runtime.savepoints import join_task_state, split_task_state

    (processor,) = stage_app(plan(chain(), "test"), 1).graph.processors
    assert processor.config["steps"] == ["gearbus_chain_first reader", "totals", "second"]
    state = {"source": {"source": {"position": {}}, "watermarks": None}, "steps": {"totals": "kept"}}
    assert join_task_state(processor, split_task_state(processor, state)) == state


def test_an_app_of_unconnected_pipelines_without_streams_is_one_stage():
    p = Pipeline("two")
    p.from_collection([1], name="a").sink(CollectSink(), name="x")
    p.from_collection([2], name="b").sink(CollectSink(), name="y")
    assert stage_count(plan(p, "test")) == 1
