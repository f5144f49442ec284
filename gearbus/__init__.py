"""gearbus: Gearpump's architecture on NATS. What user applications import.

Names load on first use (PEP 562): a process that imports one module of the package
(every role imports some) does not pay for the whole public API."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

#: Each public name and the module that defines it.
_EXPORTS = {
    "AggregateFunction": "gearbus.api.aggregators",
    "Aggregator": "gearbus.api.aggregators",
    "Count": "gearbus.api.aggregators",
    "Fold": "gearbus.api.aggregators",
    "Mean": "gearbus.api.aggregators",
    "Reduce": "gearbus.api.aggregators",
    "Sum": "gearbus.api.aggregators",
    "GroupedStream": "gearbus.api.dsl",
    "WindowedStream": "gearbus.api.dsl",
    "Application": "gearbus.api.graph",
    "Graph": "gearbus.api.graph",
    "GraphError": "gearbus.api.graph",
    "Processor": "gearbus.api.graph",
    "Joined": "gearbus.api.joins",
    "KeyedContext": "gearbus.api.keyed",
    "KeyedProcessFunction": "gearbus.api.keyed",
    "BroadcastPartitioner": "gearbus.api.partitioners",
    "CoLocationPartitioner": "gearbus.api.partitioners",
    "HashPartitioner": "gearbus.api.partitioners",
    "Partitioner": "gearbus.api.partitioners",
    "ShufflePartitioner": "gearbus.api.partitioners",
    "submitter_path": "gearbus.api.paths",
    "DataSink": "gearbus.api.task",
    "DataSource": "gearbus.api.task",
    "Record": "gearbus.api.task",
    "Task": "gearbus.api.task",
    "TaskContext": "gearbus.api.task",
    "BoundedOutOfOrderness": "gearbus.api.watermarks",
    "WATERMARK_MAX": "gearbus.api.watermarks",
    "WATERMARK_MIN": "gearbus.api.watermarks",
    "Accumulation": "gearbus.api.windows",
    "GlobalWindows": "gearbus.api.windows",
    "SessionWindows": "gearbus.api.windows",
    "SlidingWindows": "gearbus.api.windows",
    "Triggers": "gearbus.api.windows",
    "TumblingWindows": "gearbus.api.windows",
    "WindowResult": "gearbus.api.windows",
    "Pipeline": "gearbus.connectors.dsl",
    "Stream": "gearbus.connectors.dsl",
    "CollectSink": "gearbus.connectors.files",
    "CollectionSource": "gearbus.connectors.files",
    "DiscardSink": "gearbus.connectors.files",
    "JsonLinesSink": "gearbus.connectors.files",
    "JsonLinesSource": "gearbus.connectors.files",
    "TextFileSource": "gearbus.connectors.files",
    "NatsRequester": "gearbus.connectors.nats_requests",
    "NoRespondersError": "gearbus.connectors.nats_requests",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'gearbus' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))


if TYPE_CHECKING:
    from gearbus.api.aggregators import AggregateFunction, Aggregator, Count, Fold, Mean, Reduce, Sum
    from gearbus.api.dsl import GroupedStream, WindowedStream
    from gearbus.api.graph import Application, Graph, GraphError, Processor
    from gearbus.api.joins import Joined
    from gearbus.api.keyed import KeyedContext, KeyedProcessFunction
    from gearbus.api.partitioners import (
        BroadcastPartitioner,
        CoLocationPartitioner,
        HashPartitioner,
        Partitioner,
        ShufflePartitioner,
    )
    from gearbus.api.paths import submitter_path
    from gearbus.api.task import DataSink, DataSource, Record, Task, TaskContext
    from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN, BoundedOutOfOrderness
    from gearbus.api.windows import (
        Accumulation,
        GlobalWindows,
        SessionWindows,
        SlidingWindows,
        Triggers,
        TumblingWindows,
        WindowResult,
    )
    from gearbus.connectors.dsl import Pipeline, Stream
    from gearbus.connectors.files import (
        CollectionSource,
        CollectSink,
        DiscardSink,
        JsonLinesSink,
        JsonLinesSource,
        TextFileSource,
    )
    from gearbus.connectors.nats_requests import NatsRequester, NoRespondersError
