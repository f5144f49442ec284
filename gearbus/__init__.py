"""gearbus: Gearpump's architecture on NATS. What user applications import."""

from gearbus.api.graph import Application, Graph, GraphError, Processor
from gearbus.api.partitioners import (
    BroadcastPartitioner,
    CoLocationPartitioner,
    HashPartitioner,
    Partitioner,
    ShufflePartitioner,
)
from gearbus.api.task import DataSink, DataSource, Record, Task, TaskContext
from gearbus.connectors.files import CollectionSource, JsonLinesSink, TextFileSource

__all__ = [
    "Application",
    "BroadcastPartitioner",
    "CoLocationPartitioner",
    "CollectionSource",
    "DataSink",
    "DataSource",
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
