"""The steps of a pipeline's logical graph, one frozen description per kind (as bytewax's
dataflow operators and Beam's transforms): what the user asked for, checked when the DSL
adds it and never changed after. The planner reads them to build processors; the Spark
runner translates them; neither writes to them.

A step is hashable by identity (pipelines key dicts by step), and its ``kind`` is the DSL
call that makes it, as error messages and derived names show it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from gearbus.api.aggregators import Aggregator
from gearbus.api.task import DataSink, DataSource, Task
from gearbus.api.watermarks import BoundedOutOfOrderness
from gearbus.api.windows import Accumulation, WindowAssigner


@dataclass(frozen=True, eq=False, kw_only=True)
class Step:
    """One node of the logical graph."""

    kind: ClassVar[str]
    name: str
    inputs: tuple[Step, ...] = ()
    parallelism: int | None = None  # None: the planner's choice (its input's, or the pipeline's)
    derived_from: str = ""  # the base of a name the user did not give ("": given; savepoints match state by name)
    defined_at: str = ""  # "file:line" of the user's call that made the step

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


@dataclass(frozen=True, eq=False, kw_only=True)
class Source(Step):
    kind: ClassVar[str] = "source"
    data_source: DataSource
    watermarks: BoundedOutOfOrderness
    timestamp_fn: Callable[[Any], int] | None = None  # None: the source's own event time, or ingestion time


@dataclass(frozen=True, eq=False, kw_only=True)
class ValueStep(Step):
    """A stateless step: each value through ``fn``."""

    fn: Callable[[Any], Any]


class Map(ValueStep):
    kind: ClassVar[str] = "map"


class FlatMap(ValueStep):
    kind: ClassVar[str] = "flat_map"


class Filter(ValueStep):
    kind: ClassVar[str] = "filter"


@dataclass(frozen=True, eq=False, kw_only=True)
class MapAsync(ValueStep):
    kind: ClassVar[str] = "map_async"
    concurrency: int
    ordered: bool
    timeout_ms: float | None = None
    on_timeout: Callable[[Any], Any] | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class GroupBy(Step):
    """Keys each record; the steps that read it get records of equal keys in one task."""

    kind: ClassVar[str] = "group_by"
    key_fn: Callable[[Any], Any]


@dataclass(frozen=True, eq=False, kw_only=True)
class Repartition(GroupBy):
    """A group_by whose records reach their readers through an intermediate stream the app
    owns (``via="jetstream"``): a stage boundary, like Samza's partitionBy; ``via="bus"``
    is a plain group_by. ``partitions``: the stream's, else the planner's rule."""

    kind: ClassVar[str] = "repartition"
    via: str = "jetstream"
    partitions: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class Aggregate(Step):
    """A keyed aggregation per window (the global window unless ``window(...)`` said)."""

    kind: ClassVar[str] = "aggregate"
    aggregator: Aggregator
    assigner: WindowAssigner
    trigger: Any = None
    accumulation: Accumulation = Accumulation.DISCARDING
    allowed_lateness_ms: int = 0
    late_sink: DataSink | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class KeyedStep(Step):
    """Per-key state over a grouped stream; ``ttl_ms`` forgets a key not written for that long."""

    ttl_ms: int | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class StatefulMap(KeyedStep):
    kind: ClassVar[str] = "stateful_map"
    fn: Callable[[Any, Any], tuple[Any, Any]]


@dataclass(frozen=True, eq=False, kw_only=True)
class ProcessKeyed(KeyedStep):
    kind: ClassVar[str] = "process_keyed"
    function: Any  # a KeyedProcessFunction


@dataclass(frozen=True, eq=False, kw_only=True)
class Join(Step):
    """Two inputs (left, right) keyed by ``keys`` and co-partitioned by that key."""

    keys: tuple[Callable[[Any], Any], Callable[[Any], Any]]


@dataclass(frozen=True, eq=False, kw_only=True)
class WindowJoin(Join):
    kind: ClassVar[str] = "join"
    window: WindowAssigner
    how: str


@dataclass(frozen=True, eq=False, kw_only=True)
class IntervalJoin(Join):
    kind: ClassVar[str] = "interval_join"
    lower_ms: int
    upper_ms: int


@dataclass(frozen=True, eq=False, kw_only=True)
class TableJoin(Join):
    kind: ClassVar[str] = "join_table"
    as_of: str
    how: str
    ttl_ms: int | None = None
    table_value: Callable[[Any], Any] | None = None


@dataclass(frozen=True, eq=False, kw_only=True)
class Merge(Step):
    kind: ClassVar[str] = "merge"


@dataclass(frozen=True, eq=False, kw_only=True)
class Process(Step):
    """A custom low-level Task: a processor of its own."""

    kind: ClassVar[str] = "process"
    task_class: type[Task]
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, eq=False, kw_only=True)
class Sink(Step):
    kind: ClassVar[str] = "sink"
    data_sink: DataSink


T = TypeVar("T")


def for_step(table: dict[type[Step], T], step: Step) -> T | None:
    """What ``table`` holds for ``step``'s class or the nearest of its bases (a repartition
    is translated as a group_by unless the table says otherwise); None for none."""
    return next((table[kind] for kind in type(step).__mro__ if kind in table), None)
