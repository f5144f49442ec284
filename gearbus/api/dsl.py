"""The fluent DSL (Gearpump's DSL, Samza's high-level API): users write pipelines of
named steps; the planner turns them into a processor DAG that every runner runs.

    p = Pipeline("wordcount")
    (p.source(TextFileSource(path))
      .flat_map(str.split, name="split")
      .group_by(lambda w: w, name="by_word")
      .count(name="count")
      .map(lambda r: {"word": r.key, "count": r.value})
      .sink(JsonLinesSink(out)))

These classes describe steps over any DataSource and DataSink; the named connector steps
(``read_text``, ``write_jsonl``, ...) are added by :mod:`gearbus.connectors.dsl`, whose
Pipeline is ``gearbus.Pipeline``: the api never imports a connector.
"""

from __future__ import annotations

import inspect
import itertools
import numbers
import os
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from gearbus.api.aggregators import Aggregator, Count, Fold, Reduce, Sum
from gearbus.api.graph import GraphError
from gearbus.api.keyed import check_keyed_function
from gearbus.api.partitioners import MAX_PARALLELISM
from gearbus.api.joins import JOIN_KINDS, TABLE_MODES, check_key_function
from gearbus.api.steps import (
    Aggregate,
    FlatMap,
    Filter,
    GroupBy,
    IntervalJoin,
    Map,
    MapAsync,
    Merge,
    Process,
    ProcessKeyed,
    Repartition,
    Sink,
    Source,
    StatefulMap,
    Join,
    KeyedStep,
    Step,
    TableJoin,
    WindowJoin,
)
from gearbus.api.task import DataSink, DataSource, Task
from gearbus.api.watermarks import BoundedOutOfOrderness
from gearbus.api.windows import Accumulation, GlobalWindows, WindowAssigner, checked_millis


REPARTITION_VIA = ("jetstream", "bus")
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def caller_line() -> str:
    """``file:line`` of the first call outside gearbus on the stack: the user's line that
    made a step, so what is said about the step points there, not into gearbus."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE_DIR):
        frame = frame.f_back
    if frame is None:
        return ""
    path = frame.f_code.co_filename
    relative = os.path.relpath(path) if os.path.isabs(path) else path
    return f"{path if relative.startswith('..') else relative}:{frame.f_lineno}"


class BasePipeline:
    """A logical streaming graph. Build steps from :meth:`source`; every step gets a
    unique name, checked as it is added."""

    def __init__(self, name: str, config: dict[str, Any] | None = None, parallelism: int = 1):
        if not isinstance(parallelism, int) or parallelism < 1:
            raise GraphError(f"pipeline {name!r}: parallelism must be an integer >= 1")
        self.name = name
        self.config = dict(config or {})
        self.parallelism = parallelism
        self.steps: list[Step] = []
        self._names: set[str] = set()
        self._counters: dict[str, itertools.count] = {}

    def _add(self, step_type: type[Step], name: str | None, inputs: list[Step], parallelism=None, default: str = "",
             **fields) -> Step:
        """Add a step; without a name it gets ``default``, its function's name or its kind,
        made unique with a suffix."""
        kind = step_type.kind
        base = ""
        if name is None:
            fn = fields.get("fn")
            base = default or (getattr(fn, "__name__", "") if fn is not None else "")
            base = base if base.isidentifier() and base != "<lambda>" else kind
            counter = self._counters.setdefault(base, itertools.count(1))
            name = base
            while name in self._names:
                name = f"{base}_{next(counter)}"
        elif not isinstance(name, str) or not name:
            raise GraphError(f"a {kind} step needs a non-empty string name, got {name!r}")
        elif name in self._names:
            raise GraphError(f"duplicate step name {name!r}: every step needs a unique name")
        if parallelism is not None and (not isinstance(parallelism, int) or parallelism < 1):
            raise GraphError(f"step {name!r}: parallelism must be an integer >= 1, got {parallelism!r}")
        for function in ("fn", "key_fn", "timestamp_fn"):
            if fields.get(function) is not None and not callable(fields[function]):
                raise GraphError(f"step {name!r}: {fields[function]!r} is not callable")
        step = step_type(name=name, inputs=tuple(inputs), parallelism=parallelism, derived_from=base,
                         defined_at=caller_line(), **fields)
        self._names.add(name)
        self.steps.append(step)
        return step

    def _stream_of(self, step: Step) -> BaseStream:
        """The stream of ``step``'s records; a Pipeline that adds steps returns its own Stream."""
        return BaseStream(self, step)

    # --- sources ----------------------------------------------------------------

    def source(self, data_source: DataSource, *, name: str | None = None, parallelism: int = 1,
               timestamp_fn: Callable[[Any], int] | None = None, max_out_of_orderness_ms: int = 0) -> BaseStream:
        """Read from a DataSource. ``timestamp_fn(value)`` gives each record's event time
        (epoch ms; default: ingestion time); the watermark trails the newest timestamp by
        ``max_out_of_orderness_ms``."""
        return self._source(data_source, type(data_source).__name__.removesuffix("Source").lower(), name=name,
                            parallelism=parallelism, timestamp_fn=timestamp_fn,
                            max_out_of_orderness_ms=max_out_of_orderness_ms)

    def _source(self, data_source, default: str, name=None, parallelism=1, timestamp_fn=None,
                max_out_of_orderness_ms=0) -> BaseStream:
        if not isinstance(data_source, DataSource):
            raise GraphError(f"source {name or default}: {data_source!r} is not a gearbus DataSource")
        try:
            watermarks = BoundedOutOfOrderness(max_out_of_orderness_ms)
        except ValueError as exc:
            raise GraphError(f"source {name or default}: {exc}") from None
        step = self._add(Source, name, [], parallelism, default, data_source=data_source, watermarks=watermarks,
                         timestamp_fn=timestamp_fn)
        return self._stream_of(step)


class BaseStream:
    """A stream of records produced by one step."""

    def __init__(self, pipeline: BasePipeline, step: Step):
        self.pipeline = pipeline
        self.step = step

    def _then(self, step_type: type[Step], name, parallelism=None, default="", **fields) -> BaseStream:
        return self.pipeline._stream_of(self.pipeline._add(step_type, name, [self.step], parallelism, default, **fields))

    def map(self, fn: Callable[[Any], Any], name: str | None = None, parallelism: int | None = None) -> BaseStream:
        """Transform each value. A ``parallelism`` other than the input's starts a new
        processor (records are spread round-robin); otherwise the step is chained."""
        return self._then(Map, name, parallelism, fn=fn)

    def map_async(self, async_fn: Callable[[Any], Awaitable[Any]], concurrency: int = 100, ordered: bool = True,
                  timeout_ms: float | None = None, on_timeout: Callable[[Any], Any] | None = None,
                  name: str | None = None) -> BaseStream:
        """Transform each value with ``await async_fn(value)`` (an ``async def``: a lookup,
        a web service), with up to ``concurrency`` calls in flight per task on the task's
        event loop; chained like :meth:`map`.

        ``ordered``: results keep the input's order; otherwise they go out as calls
        finish, but never past a watermark (nor a watermark past them), in either mode.
        ``timeout_ms``: a call that takes longer fails the app, naming the step and the
        record, unless ``on_timeout(value)`` gives the result then. With ``concurrency``
        calls in flight the task takes no input (back-pressure). Records in flight are
        part of every checkpoint and called again after a recovery, so each result goes
        out exactly once (the calls themselves may repeat: make them idempotent)."""
        shown = name or getattr(async_fn, "__name__", "map_async")
        if not _is_async(async_fn):
            raise GraphError(f"map_async step {shown!r}: {async_fn!r} is not an async function (async def)")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise GraphError(f"map_async step {shown!r}: concurrency must be an integer >= 1, got {concurrency!r}")
        if not isinstance(ordered, bool):
            raise GraphError(f"map_async step {shown!r}: ordered must be True or False, got {ordered!r}")
        if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, numbers.Real)
                                       or not 0 < timeout_ms < float("inf")):
            raise GraphError(f"map_async step {shown!r}: timeout_ms must be a number > 0 (or None), "
                             f"got {timeout_ms!r}")
        if on_timeout is not None:
            if timeout_ms is None:
                raise GraphError(f"map_async step {shown!r}: on_timeout needs a timeout_ms")
            if not callable(on_timeout) or _is_async(on_timeout):
                raise GraphError(f"map_async step {shown!r}: on_timeout must be a plain (not async) function, "
                                 f"got {on_timeout!r}")
        return self._then(MapAsync, name, fn=async_fn, concurrency=concurrency, ordered=ordered, timeout_ms=timeout_ms,
                          on_timeout=on_timeout)

    def flat_map(self, fn: Callable[[Any], Iterable[Any]], name: str | None = None,
                 parallelism: int | None = None) -> BaseStream:
        return self._then(FlatMap, name, parallelism, fn=fn)

    def filter(self, fn: Callable[[Any], bool], name: str | None = None, parallelism: int | None = None) -> BaseStream:
        return self._then(Filter, name, parallelism, fn=fn)

    def group_by(self, key_fn: Callable[[Any], Any], parallelism: int | None = None,
                 name: str | None = None) -> GroupedStream:
        """Partition by ``key_fn(value)``: records with equal keys meet in one task."""
        return GroupedStream(self._then(GroupBy, name, parallelism, default="group_by", key_fn=key_fn))

    def repartition(self, key_fn: Callable[[Any], Any], via: str = "jetstream", partitions: int | None = None,
                    name: str | None = None) -> GroupedStream:
        """Partition by ``key_fn(value)`` as :meth:`group_by` does, through an intermediate
        stream (``via="jetstream"``): a JetStream stream the app owns, with ``partitions``
        subjects (default: the larger of the parallelisms on its two sides; the inputs of a
        join get one count). It cuts the app into stages that checkpoint and recover on
        their own. ``via="bus"``: an ordinary shuffle."""
        what = f"repartition {name or ''}".strip()
        if via not in REPARTITION_VIA:
            raise GraphError(f"{what}: via must be one of {', '.join(map(repr, REPARTITION_VIA))}, got {via!r}")
        if partitions is not None and (isinstance(partitions, bool) or not isinstance(partitions, int)
                                       or not 1 <= partitions <= MAX_PARALLELISM):
            raise GraphError(f"{what}: partitions must be an integer from 1 to {MAX_PARALLELISM} (or None), "
                             f"got {partitions!r}")
        return GroupedStream(self._then(Repartition, name, None, "repartition", key_fn=key_fn, via=via,
                                        partitions=partitions))

    def merge(self, *others: BaseStream, name: str | None = None) -> BaseStream:
        """The union of this stream and ``others``."""
        for other in others:
            if not isinstance(other, BaseStream) or other.pipeline is not self.pipeline:
                raise GraphError(f"merge {name or ''}: can only merge streams of the same pipeline")
        step = self.pipeline._add(Merge, name, [self.step] + [o.step for o in others])
        return self.pipeline._stream_of(step)

    def process(self, task_class: type[Task], parallelism: int | None = None, name: str | None = None,
                **config) -> BaseStream:
        """Drop down to a custom low-level Task (its own processor)."""
        if not (isinstance(task_class, type) and issubclass(task_class, Task)):
            raise GraphError(f"process {name or ''}: {task_class!r} is not a gearbus Task subclass")
        return self._then(Process, name, parallelism, default=task_class.__name__, task_class=task_class, config=config)

    # --- joins -----------------------------------------------------------------------

    def join(self, other: BaseStream, left_key: Callable[[Any], Any] | None = None,
             right_key: Callable[[Any], Any] | None = None, window: WindowAssigner | None = None, how: str = "inner",
             name: str | None = None, parallelism: int | None = None) -> BaseStream:
        """A window join (see :mod:`gearbus.api.joins`): the ``Joined(left, right)`` pairs of
        equal keys in the same ``window`` (TumblingWindows, SlidingWindows, SessionWindows),
        emitted when the watermark closes it; ``how``: "inner", "left", "right", "outer"."""
        what = f"join {name or ''}".strip()
        if not isinstance(window, WindowAssigner):
            raise GraphError(f"{what}: window must be TumblingWindows, SlidingWindows or SessionWindows, got {window!r}")
        if how not in JOIN_KINDS:
            raise GraphError(f"{what}: how must be one of {', '.join(map(repr, JOIN_KINDS))}, got {how!r}")
        return self._join(other, WindowJoin, name, parallelism, left_key, right_key, window=window, how=how)

    def interval_join(self, other: BaseStream, left_key: Callable[[Any], Any] | None = None,
                      right_key: Callable[[Any], Any] | None = None, lower_ms: int | None = None,
                      upper_ms: int | None = None, name: str | None = None, parallelism: int | None = None) -> BaseStream:
        """An inner interval join: ``Joined(l, r)`` for equal keys where
        ``l.ts + lower_ms <= r.ts <= l.ts + upper_ms`` (bounds inclusive, may be negative)."""
        what = f"interval_join {name or ''}".strip()
        try:
            lower, upper = checked_millis("lower_ms", lower_ms), checked_millis("upper_ms", upper_ms)
        except ValueError as exc:
            raise GraphError(f"{what}: {exc}") from None
        if lower > upper:
            raise GraphError(f"{what}: lower_ms ({lower}) must not exceed upper_ms ({upper})")
        return self._join(other, IntervalJoin, name, parallelism, left_key, right_key, lower_ms=lower, upper_ms=upper)

    def join_table(self, table: BaseStream, key: Callable[[Any], Any] | None = None,
                   table_key: Callable[[Any], Any] | None = None, as_of: str = "latest", ttl_ms: int | None = None,
                   how: str = "inner", table_value: Callable[[Any], Any] | None = None, name: str | None = None,
                   parallelism: int | None = None) -> BaseStream:
        """Enrich each record with the value ``table`` (a changelog stream: upserts by
        ``table_key``; a value of None deletes) holds for ``key(record)``: ``Joined(record,
        value)``. ``as_of``: "latest" (the value when the record is processed) or
        "event_time" (the value valid at the record's timestamp). ``table_value(change)``
        gives the value of a change (default: the change itself); ``ttl_ms`` forgets values
        not written for that long (event time); ``how="left"`` keeps records the table
        does not know, with None."""
        what = f"join_table {name or ''}".strip()
        if as_of not in TABLE_MODES:
            raise GraphError(f"{what}: as_of must be one of {', '.join(map(repr, TABLE_MODES))}, got {as_of!r}")
        if how not in ("inner", "left"):
            raise GraphError(f"{what}: how must be 'inner' or 'left', got {how!r}")
        if table_value is not None and not callable(table_value):
            raise GraphError(f"{what}: table_value must be a function of the change, got {table_value!r}")
        try:
            ttl = None if ttl_ms is None else checked_millis("ttl_ms", ttl_ms, 1)
        except ValueError as exc:
            raise GraphError(f"{what}: {exc}") from None
        return self._join(table, TableJoin, name, parallelism, key, table_key, as_of=as_of, ttl_ms=ttl, how=how,
                          table_value=table_value)

    def _join(self, other, join_type: type[Join], name, parallelism, left_key, right_key, **fields) -> BaseStream:
        what = f"{join_type.kind} {name or ''}".strip()
        if not isinstance(other, BaseStream) or other.pipeline is not self.pipeline:
            raise GraphError(f"{what}: can only join a Stream of the same pipeline (not a grouped or windowed "
                             f"stream), got {other!r}")
        step_name = name or what
        table = join_type is TableJoin
        keys = (check_key_function(step_name, "key" if table else "left_key", left_key),
                check_key_function(step_name, "table_key" if table else "right_key", right_key))
        if not table or fields["as_of"] == "event_time":
            for stream in (self, other):
                source = _source_without_event_time(stream.step)
                if source is not None:
                    raise GraphError(
                        f"{what}: joins in event time, but source {source.name!r} stamps records with the time "
                        "they were read: give it timestamp_fn=... (an event time per record)")
        step = self.pipeline._add(join_type, name, [self.step, other.step], parallelism, join_type.kind, keys=keys,
                                  **fields)
        return self.pipeline._stream_of(step)

    def sink(self, data_sink: DataSink, parallelism: int = 1, name: str | None = None) -> None:
        if not isinstance(data_sink, DataSink):
            raise GraphError(f"sink {name or ''}: {data_sink!r} is not a gearbus DataSink")
        self._then(Sink, name, parallelism, default=type(data_sink).__name__.removesuffix("Sink").lower(),
                   data_sink=data_sink)

    def _needs_key(self, what: str):
        raise GraphError(f"{what} after step {self.step.name!r} needs a keyed stream: call group_by(...) first")

    def window(self, *args, **kwargs):
        self._needs_key("window(...)")

    def reduce(self, *args, **kwargs):
        self._needs_key("reduce(...)")

    def fold(self, *args, **kwargs):
        self._needs_key("fold(...)")

    def aggregate(self, *args, **kwargs):
        self._needs_key("aggregate(...)")

    def count(self, *args, **kwargs):
        self._needs_key("count()")

    def sum(self, *args, **kwargs):
        self._needs_key("sum()")

    def process_keyed(self, *args, **kwargs):
        self._needs_key("process_keyed(...) (keyed state and timers)")

    def stateful_map(self, *args, **kwargs):
        self._needs_key("stateful_map(...)")


def _source_without_event_time(step: Step) -> Step | None:
    """A source upstream of ``step`` whose records carry ingestion time, if any."""
    seen, todo = set(), [step]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        if isinstance(current, Source) and current.timestamp_fn is None and not current.data_source.event_time:
            return current
        todo.extend(current.inputs)
    return None


def _is_async(fn) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


class GroupedStream:
    """A keyed stream: aggregate it, per key, over windows (the global window by default)."""

    def __init__(self, stream: BaseStream):
        self._stream = stream
        self.pipeline = stream.pipeline
        self.step = stream.step

    def window(self, assigner, trigger=None, accumulation: Accumulation = Accumulation.DISCARDING,
               allowed_lateness_ms: int = 0, late_sink: DataSink | None = None) -> WindowedStream:
        """Aggregate per key and per window; results fire when the watermark passes a
        window's end (plus early firings if ``trigger`` asks for them). Records later
        than ``allowed_lateness_ms`` are dropped and counted, or written to ``late_sink``."""
        if late_sink is not None and not isinstance(late_sink, DataSink):
            raise GraphError(f"window after step {self.step.name!r}: late_sink must be a gearbus DataSink")
        return WindowedStream(self, assigner, trigger, accumulation, allowed_lateness_ms, late_sink)

    def process(self, task_class: type[Task], parallelism: int | None = None, name: str | None = None,
                **config) -> BaseStream:
        """A custom low-level Task over the keyed stream: records with equal keys reach the
        same task (``record.key``), so the task may keep state per key."""
        return self._stream.process(
            task_class, self.step.parallelism if parallelism is None else parallelism, name, **config)

    def process_keyed(self, function, name: str | None = None, ttl_ms: int | None = None,
                      parallelism: int | None = None) -> BaseStream:
        """Per-key state and timers (see :mod:`gearbus.api.keyed`): ``function`` is a
        KeyedProcessFunction subclass or a plain ``fn(value, ctx)``. ``ttl_ms``: a key's
        state not written for that long (event time) is forgotten."""
        return self._keyed(ProcessKeyed, name, parallelism, ttl_ms,
                           function=check_keyed_function(name or self.step.name, function))

    def stateful_map(self, fn: Callable[[Any, Any], tuple[Any, Any]], ttl_ms: int | None = None,
                     name: str | None = None, parallelism: int | None = None) -> BaseStream:
        """``fn(state, value) -> (state, out)`` per record, with the record's key's state
        (None at first; returning None as the state forgets the key); emits ``out``."""
        if not callable(fn):
            raise GraphError(f"stateful_map {name or ''} after {self.step.name!r}: {fn!r} is not callable")
        return self._keyed(StatefulMap, name, parallelism, ttl_ms, fn=fn)

    def _keyed(self, step_type: type[KeyedStep], name, parallelism, ttl_ms, **fields) -> BaseStream:
        what = f"{step_type.kind} {name or ''} after {self.step.name!r}"
        try:
            ttl = None if ttl_ms is None else checked_millis("ttl_ms", ttl_ms, 1)
        except ValueError as exc:
            raise GraphError(f"{what}: {exc}") from None
        return self._stream._then(step_type, name, self.step.parallelism if parallelism is None else parallelism,
                                  step_type.kind, ttl_ms=ttl, **fields)

    def _global(self) -> WindowedStream:
        return WindowedStream(self, GlobalWindows(), None, Accumulation.DISCARDING, 0, None)

    def aggregate(self, aggregator: Aggregator, name: str | None = None) -> BaseStream:
        return self._global().aggregate(aggregator, name)

    def reduce(self, fn: Callable[[Any, Any], Any], name: str | None = None) -> BaseStream:
        return self._global().reduce(fn, name)

    def fold(self, zero: Any, fn: Callable[[Any, Any], Any], name: str | None = None) -> BaseStream:
        return self._global().fold(zero, fn, name)

    def count(self, name: str | None = None) -> BaseStream:
        return self._global().count(name)

    def sum(self, value_fn: Callable[[Any], Any] | None = None, name: str | None = None) -> BaseStream:
        return self._global().sum(value_fn, name)


_AGGREGATE_NAMES = {"AggregateFunction": "aggregate"}


class WindowedStream:
    """A keyed, windowed stream; each aggregation emits WindowResult values
    ``(key, value, window_start, window_end, timing)``."""

    def __init__(self, grouped: GroupedStream, assigner, trigger, accumulation, allowed_lateness_ms, late_sink):
        self._grouped = grouped
        self.assigner = assigner
        self.trigger = trigger
        self.accumulation = accumulation
        self.allowed_lateness_ms = allowed_lateness_ms
        self.late_sink = late_sink

    def aggregate(self, aggregator: Aggregator, name: str | None = None) -> BaseStream:
        if not isinstance(aggregator, Aggregator):
            raise GraphError(f"aggregate {name or ''}: {aggregator!r} is not a gearbus Aggregator")
        grouped = self._grouped
        return grouped._stream._then(
            Aggregate, name, grouped.step.parallelism,
            _AGGREGATE_NAMES.get(type(aggregator).__name__, type(aggregator).__name__.lower()), aggregator=aggregator, assigner=self.assigner, trigger=self.trigger, accumulation=self.accumulation,
            allowed_lateness_ms=self.allowed_lateness_ms, late_sink=self.late_sink,
        )

    def _function(self, what: str, fn, name: str | None, optional: bool = False):
        if not callable(fn) and not (optional and fn is None):
            raise GraphError(f"{what} step {name or what!r} after {self._grouped.step.name!r}: {fn!r} is not callable")
        return fn

    def reduce(self, fn, name=None) -> BaseStream:
        return self.aggregate(Reduce(self._function("reduce", fn, name)), name)

    def fold(self, zero, fn, name=None) -> BaseStream:
        return self.aggregate(Fold(zero, self._function("fold", fn, name)), name)

    def count(self, name=None) -> BaseStream:
        return self.aggregate(Count(), name)

    def sum(self, value_fn=None, name=None) -> BaseStream:
        return self.aggregate(Sum(self._function("sum", value_fn, name, optional=True)), name)
