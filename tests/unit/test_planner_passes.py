"""The planner's passes one at a time, on the Layout each hands the next: what chaining,
connecting, placing operators, keying join inputs, combining map-side and running steps at
senders each decide alone (tests/unit/test_planner.py checks the plans they make together)."""

from __future__ import annotations

import dataclasses

import pytest

from gearbus import CollectSink, GraphError, Pipeline, TumblingWindows
from gearbus.api.steps import Aggregate, GroupBy, Map, Source
from gearbus.planner import (
    JoinInput,
    Layout,
    chain,
    check,
    combine_map_side,
    connect,
    key_join_inputs,
    place_operators,
    run_at_senders,
)
from gearbus.runtime.chain import CombineOp, FilterOp, KeyByOp, MapOp, SinkOp, WindowAggregateOp
from gearbus.runtime.joins import JoinInputOp, WindowJoinOp

pytestmark = pytest.mark.unit


def counted(window=None) -> Pipeline:
    """src(1) -> double -> nonzero -> by_parity -> count (2) -> show -> out (1)."""
    p = Pipeline("counted", parallelism=2)
    grouped = (p.from_collection(range(10), name="src", timestamp_fn=lambda v: v)
               .map(lambda v: v * 2, name="double").filter(bool, name="nonzero").group_by(lambda v: v % 4, name="by_parity"))
    counts = grouped.window(window).count(name="count") if window else grouped.count(name="count")
    counts.map(str, name="show").sink(CollectSink(), name="out")
    return p


def laid_out(pipeline: Pipeline, *passes) -> Layout:
    layout = Layout(pipeline)
    for run in passes:
        run(layout)
    return layout


def shape(layout: Layout) -> list[tuple[list[str], int]]:
    return [([s.name for s in segment.steps], segment.parallelism) for segment in layout.segments]


def inputs(layout: Layout) -> list[list[tuple[int, str]]]:
    index = {id(s): i for i, s in enumerate(layout.segments)}
    return [[(index[id(u)], type(p).__name__) for u, p in segment.inputs] for segment in layout.segments]


def test_steps_are_frozen_descriptions_typed_by_kind():
    p = counted()
    src, double, *_ = p.steps
    assert isinstance(src, Source) and src.kind == "source" and src.timestamp_fn is not None
    assert isinstance(double, Map) and double.inputs == (src,)
    assert [type(s) for s in p.steps][3:5] == [GroupBy, Aggregate]
    with pytest.raises(dataclasses.FrozenInstanceError):
        double.name = "other"


def test_chain_puts_steps_in_processors_by_gearpumps_rule():
    """The group_by chains into its input's processor (it only keys); the count holds keyed
    state, so it starts one at the pipeline's parallelism; the sink asks for 1, so it does."""
    layout = laid_out(counted(), chain)
    assert shape(layout) == [(["src", "double", "nonzero", "by_parity"], 1), (["count", "show"], 2), (["out"], 1)]
    assert layout.segments[0].inputs == [] and layout.segments[0].ops == []  # later passes' work


def test_connect_hashes_what_reads_a_group_by_and_forwards_the_rest():
    layout = laid_out(counted(), chain, connect)
    assert inputs(layout) == [[], [(0, "HashPartitioner")], [(1, "ShufflePartitioner")]]


def test_place_operators_gives_each_step_its_own_and_combines_nothing():
    layout = laid_out(counted(), chain, connect, place_operators)
    assert [[type(op) for op in s.ops] for s in layout.segments] == [
        [MapOp, FilterOp, KeyByOp], [WindowAggregateOp, MapOp], [SinkOp]]
    assert layout.segments[1].ops[0].partial_input is False


def test_combine_map_side_takes_over_the_keying_and_the_value_steps_before_it():
    layout = laid_out(counted(), chain, connect, place_operators)
    combine_map_side(layout, combine_keys=50)
    (combine,), (aggregate, _) = layout.segments[0].ops, layout.segments[1].ops
    assert isinstance(combine, CombineOp) and combine.max_keys == 50
    assert [type(v) for v in combine.value_ops] == [MapOp, FilterOp]
    assert isinstance(aggregate, WindowAggregateOp) and aggregate.partial_input is True


def test_combine_map_side_leaves_windowed_aggregations_alone():
    layout = laid_out(counted(TumblingWindows(5)), chain, connect, place_operators)
    before = [list(s.ops) for s in layout.segments]
    combine_map_side(layout, combine_keys=50)
    assert [s.ops for s in layout.segments] == before


def self_join() -> Pipeline:
    p = Pipeline("self", parallelism=2)
    events = p.from_collection(range(6), name="events", timestamp_fn=lambda v: v)
    events.join(events, lambda v: v % 2, lambda v: v % 3, TumblingWindows(10), name="pairs").sink(CollectSink(), name="out")
    return p


def test_key_join_inputs_keys_a_shared_input_in_processors_of_its_own_after_the_join():
    layout = laid_out(self_join(), chain, connect, place_operators, key_join_inputs)
    assert shape(layout) == [(["events"], 1), (["pairs"], 2), (["pairs.left"], 1), (["pairs.right"], 1), (["out"], 1)]
    assert all(isinstance(layout.segments[i].head, JoinInput) for i in (2, 3))
    assert inputs(layout) == [[], [(2, "HashPartitioner"), (3, "HashPartitioner")], [(0, "CoLocationPartitioner")],
                              [(0, "CoLocationPartitioner")], [(1, "ShufflePartitioner")]]
    assert [(op.side, type(op)) for i in (2, 3) for op in layout.segments[i].ops] == [(0, JoinInputOp), (1, JoinInputOp)]
    assert [type(op) for op in layout.segments[1].ops] == [WindowJoinOp]


def test_key_join_inputs_keys_an_input_read_once_at_the_end_of_its_processor():
    p = Pipeline("two", parallelism=2)
    left = p.from_collection(range(3), name="left", timestamp_fn=lambda v: v).map(str, name="as_text")
    right = p.from_collection(range(3), name="right", timestamp_fn=lambda v: v)
    left.join(right, len, lambda v: v, TumblingWindows(10), name="pairs").sink(CollectSink(), name="out")
    layout = laid_out(p, chain, connect, place_operators, key_join_inputs)
    assert shape(layout) == [(["left", "as_text"], 1), (["right"], 1), (["pairs"], 2), (["out"], 1)]
    assert [type(op) for op in layout.segments[0].ops] == [MapOp, JoinInputOp]
    assert [type(op) for op in layout.segments[1].ops] == [JoinInputOp]


def test_run_at_senders_removes_a_stateless_processor_read_once():
    """A split stream's stateless branch that could not chain (its input has two readers)
    runs at the input's sender; its processor goes away."""
    p = Pipeline("split")
    events = p.from_collection(range(4), name="events")
    events.map(str, name="as_text").sink(CollectSink(), name="texts")
    events.filter(bool, name="nonzero").sink(CollectSink(), name="numbers")
    layout = laid_out(p, chain, connect, place_operators)
    assert shape(layout) == [(["events"], 1), (["as_text", "texts"], 1), (["nonzero", "numbers"], 1)]
    run_at_senders(layout.segments)
    assert [[type(op) for op in s.ops] for s in layout.segments] == [[], [MapOp, SinkOp], [SinkOp]]
    assert layout.segments[2].inputs[0][1].describe() == "CoLocationPartitioner after nonzero"


def test_check_names_the_step_and_the_runner():
    p = Pipeline("bad")
    p.from_collection(range(3), name="src").group_by(len).window(TumblingWindows(10), allowed_lateness_ms=-1) \
        .count(name="late_count").sink(CollectSink(), name="out")
    with pytest.raises(GraphError, match="late_count"):
        check(p, "test")
    with pytest.raises(GraphError, match="unknown runner 'spark'"):
        check(counted(), "spark")
