"""The DSL's NATS steps: arguments checked at build time, and how they are planned."""

from __future__ import annotations

import pytest

from gearbus import Pipeline
from gearbus.api.graph import GraphError
from gearbus.connectors.jetstream import JetStreamTransactionalSink
from gearbus.connectors.jetstream_source import JetStreamSource, NatsSubjectSource
from gearbus.planner import plan


@pytest.mark.parametrize("kwargs, message", [
    ({"start": "yesterday"}, "start must be"),
    ({"until": "later"}, "until must be"),
    ({"decode": "xml"}, "decode must be one of"),
    ({"max_out_of_orderness_ms": -1}, "max_out_of_orderness_ms"),
])
def test_bad_read_jetstream_arguments_fail_when_the_pipeline_is_built(kwargs, message):
    with pytest.raises(GraphError, match=f"read_jetstream 'EV': {message}"):
        Pipeline("p").read_jetstream("EV", **kwargs)


def test_jetstream_steps_are_planned_as_one_processor_with_the_pipeline_parallelism():
    p = Pipeline("p", parallelism=3)
    p.read_jetstream("EV", timestamp_fn=lambda v: v["ts"], max_out_of_orderness_ms=50).map(str).write_jetstream("o")
    (processor,) = plan(p, "test").graph.processors
    assert processor.parallelism == 3
    assert processor.config["steps"] == ["read_jetstream", "str", "write_jetstream"]
    assert processor.config["timestamp_fn"] is None  # the source stamps its records itself
    assert isinstance(processor.data_source, JetStreamSource) and processor.data_source.max_out_of_orderness_ms == 50
    assert isinstance(processor.config["ops"][-1].data_sink, JetStreamTransactionalSink)
    assert JetStreamSource.replayable and JetStreamTransactionalSink.transactional


def test_read_nats_is_one_task_unless_asked_and_never_replayable():
    p = Pipeline("p", parallelism=4)
    p.read_nats("live.>", decode="text").write_jetstream("o")
    (processor,) = plan(p, "test").graph.processors
    assert processor.parallelism == 1
    assert isinstance(processor.data_source, NatsSubjectSource) and not NatsSubjectSource.replayable
    with pytest.raises(GraphError, match="read_nats 'x': decode must be"):
        Pipeline("q").read_nats("x", decode=42)
