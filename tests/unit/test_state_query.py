"""Reading a keyed step's state for one key (``gearbus state``): keys as JSON, the task that
owns a key, the steps that can be read and what they give, values as JSON."""

from __future__ import annotations

import json

import pytest

from gearbus import DiscardSink, Pipeline, SlidingWindows
from gearbus.api.aggregators import Count
from gearbus.api.partitioners import HashPartitioner, key_owner
from gearbus.api.task import Record, new_record
from gearbus.api.windows import TumblingWindows
from gearbus.planner import plan
from gearbus.runtime import state_query
from gearbus.runtime.chain import MapOp, WindowAggregateOp
from gearbus.runtime.keyed import StatefulMapOp
from gearbus.runtime.state_backend import BACKENDS
from gearbus.runtime.windows import WindowOperator
from tests.support.backends import task_holding_state_in
from shared.messages import StateValue, TaskId

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("text, key", [
    ('"word"', "word"), ("42", 42), ("null", None), ("[3, \"a\"]", (3, "a")), ("[[1, 2], 3]", ((1, 2), 3)),
    ("1.5", 1.5), ("true", True),
])
def test_a_key_is_json_and_arrays_are_tuples(text, key):
    assert state_query.parse_key(text) == key


@pytest.mark.parametrize("text, message", [
    ("word", "the key must be JSON"), ("{\"a\": 1}", "cannot be a JSON object"), ("[{}]", "cannot be a JSON object"),
])
def test_a_key_that_is_not_a_json_key_is_refused_saying_why(text, message):
    with pytest.raises(state_query.StateQueryError, match=message):
        state_query.parse_key(text)


@pytest.mark.parametrize("key", ["word", 7, (1, "b"), None])
def test_the_owner_of_a_key_is_the_task_its_hash_edge_sends_it_to(key):
    for parallelism in (1, 2, 3, 7):
        record = new_record(Record, ("value", 0, key))
        assert key_owner(key, parallelism) == HashPartitioner(by_key=True).partition(record, parallelism, 0)


def test_values_become_json_whatever_they_hold():
    class Custom:
        def __repr__(self):
            return "Custom()"

    value = {"n": 1, 2: (3, 4), (5, "x"): {7}, "f": float("inf"), "o": Custom()}
    assert json.loads(state_query.as_json(value)) == {"n": 1, "2": [3, 4], '[5, "x"]': [7], "f": "inf", "o": "Custom()"}


def counting_pipeline():
    p = Pipeline("counts", parallelism=3)
    keyed = p.from_collection([1, 2, 3], name="numbers").group_by(lambda n: n % 2, name="by_parity")
    keyed.stateful_map(lambda count, n: ((count or 0) + 1, n), name="count").sink(DiscardSink(), name="show")
    keyed.window(TumblingWindows(10)).count(name="per_window").sink(DiscardSink(), name="show_windows")
    return p


def test_a_step_is_located_in_its_processor_and_its_key_in_the_owning_task():
    processors = plan(counting_pipeline()).graph.processors
    processor, index = state_query.locate(processors, "count", "k")
    assert "count" in [op.step for op in processor.config["ops"]]
    assert index == key_owner("k", processor.parallelism)
    assert set(state_query.readable(processors)) == {"count", "per_window"}


@pytest.mark.parametrize("step, message", [
    ("nope", "no step named 'nope'; the steps holding state by key: "),
    ("show", "step 'show' holds no state by key"),
])
def test_a_step_that_cannot_be_read_is_refused_naming_those_that_can(step, message):
    processors = plan(counting_pipeline()).graph.processors
    with pytest.raises(state_query.StateQueryError, match=message) as refused:
        state_query.locate(processors, step, 1)
    assert "count" in str(refused.value) and "per_window" in str(refused.value)


def test_stateful_map_gives_the_keys_state_and_says_when_it_holds_none():
    op = StatefulMapOp("count", lambda seen, v: ((seen or 0) + v, None), ttl_ms=None)
    op.process([(5, 10, "a"), (7, 20, "a"), (1, 30, "b")])
    assert state_query.read([MapOp("m", str), op], "count", "a") == (True, 12)
    assert state_query.read([op], "count", "zzz") == (False, None)
    with pytest.raises(state_query.StateQueryError, match="holds no state by key"):
        state_query.read([MapOp("m", str), op], "m", "a")
    with pytest.raises(state_query.StateQueryError, match="has no step 'other'"):
        state_query.read([op], "other", "a")


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_window_step_gives_the_keys_open_windows_with_their_aggregate_so_far(backend, backends):
    op = WindowAggregateOp("per_window", lambda: WindowOperator(SlidingWindows(10, 5), Count()), False)
    op.open(task_holding_state_in(backend, backends))
    op.process([("x", 3, "a"), ("x", 7, "a"), ("x", 8, "b")])
    found, windows = op.state_of("a")
    assert found and windows == [{"start": -5, "end": 5, "value": 1}, {"start": 0, "end": 10, "value": 2},
                                 {"start": 5, "end": 15, "value": 1}]
    assert op.state_of("c") == (False, [])


def test_an_answer_is_one_json_object_with_key_and_value_parsed():
    reply = StateValue(1, "count", '[1, "a"]', TaskId(2, 1), True, '{"n": 3}')
    assert state_query.answer(reply) == {"app_id": 1, "step": "count", "key": [1, "a"],
                                         "task": {"processor": 2, "index": 1}, "found": True, "value": {"n": 3}}
