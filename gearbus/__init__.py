"""gearbus: Gearpump's architecture on NATS. What user applications import."""

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

__all__ = [
    "Accumulation",
    "AggregateFunction",
    "Aggregator",
    "BoundedOutOfOrderness",
    "CollectSink",
    "Count",
    "Fold",
    "GlobalWindows",
    "GroupedStream",
    "Joined",
    "JsonLinesSource",
    "KeyedContext",
    "KeyedProcessFunction",
    "Mean",
    "NatsRequester",
    "NoRespondersError",
    "Pipeline",
    "Reduce",
    "SessionWindows",
    "SlidingWindows",
    "Stream",
    "Sum",
    "Triggers",
    "TumblingWindows",
    "WATERMARK_MAX",
    "WATERMARK_MIN",
    "WindowResult",
    "WindowedStream",
    "Application",
    "BroadcastPartitioner",
    "CoLocationPartitioner",
    "CollectionSource",
    "DataSink",
    "DataSource",
    "DiscardSink",
    "Graph",
    "GraphError",
    "HashPartitioner",
    "JsonLinesSink",
    "Partitioner",
    "Processor",
    "Record",
    "ShufflePartitioner",
    "Task",
    "TaskContext",
    "TextFileSource",
]
