"""The runtime of planned DSL steps: chained operators run inside one task.

Each operator transforms a batch of records at once (a list comprehension per step is
the fast path); when user code raises, the batch is replayed record by record to name
the step and the offending record in the error.
"""

from __future__ import annotations

import collections
import copy
from operator import itemgetter
from typing import Any

from gearbus.api.io_tasks import DataSourceTask
from gearbus.api.partitioners import Partitioner, key_group, owned_groups
from gearbus.api.task import Record, Task, new_record, not_rescalable
from gearbus.api.aggregators import Count
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.keygroups import Delta, RescaleShare, WindowDelta
from gearbus.runtime.state_backend import StateBackendError, open_backend
from gearbus.runtime.windows import WindowOperator

RECORD_PREVIEW_CHARS = 200
_value, _timestamp = itemgetter(0), itemgetter(1)


_NO_VALUE = object()


class StepError(Exception):
    """User code failed inside a step; names the step and shows the value it failed on
    (``record``: its repr, bounded; "" for none)."""

    def __init__(self, step: str, value, original: BaseException):
        self.step = step
        self.value = value
        self.original = original
        self.record = ""
        if value is not _NO_VALUE:
            shown = repr(value)
            self.record = shown[:RECORD_PREVIEW_CHARS] + "..." if len(shown) > RECORD_PREVIEW_CHARS else shown
        super().__init__(f"{original} (step {step!r}{f' on record {self.record}' if self.record else ''})")


class RestoreError(ValueError):
    """A checkpoint's state does not fit the pipeline being restored."""


class Op:
    """One chained step: transforms batches; may fire on watermarks, at processing-time
    wakeups, and at the end.

    An op whose results come later (``holds_output``, e.g. async calls) returns them from
    :meth:`poll` rather than :meth:`process`, holds the watermarks behind them (the chain
    passes a watermark on past it only while it is not :meth:`pending`), and keeps in
    ``released`` the last watermark it let through.
    """

    holds_output = False
    released = WATERMARK_MIN
    #: Its state is held by key group, each group by the task owning it (whatever else it
    #: keeps goes to one heir: see gearbus.runtime.keygroups.inherited), so a task restored
    #: at another parallelism reads only the old tasks that owned some of its key groups.
    state_by_owner = False

    def __init__(self, step: str):
        self.step = step

    def open(self, task: Task) -> None:
        """Called when the hosting task starts."""

    def process(self, records: list[Record]) -> list[Record]:
        raise NotImplementedError

    def on_watermark(self, watermark: int) -> list[Record]:
        return []

    def next_wakeup_ms(self) -> int | None:
        """The earliest processing time (epoch ms) at which the op wants :meth:`on_wakeup`;
        None: never."""
        return None

    def on_wakeup(self, now_ms: int) -> list[Record]:
        """Processing time reached :meth:`next_wakeup_ms`: the records to emit, which go
        through the ops after this one."""
        return []

    def poll(self) -> list[tuple[list[Record], int | None]]:
        """A ``holds_output`` op: what can go out now, as runs of records each followed by
        the watermark it releases (None: no watermark after that run)."""
        return []

    def pending(self) -> bool:
        """A ``holds_output`` op: whether it holds records or watermarks still."""
        return False

    def full(self) -> bool:
        """A ``holds_output`` op: whether it takes no more input now (the task stops
        reading until a poll made room)."""
        return False

    #: Whether :meth:`state_of` reads the step's state for one key (``gearbus state``).
    keyed_state = False

    def state_of(self, key) -> tuple[bool, Any]:
        """(whether the step holds state for ``key``, that state as a user would read it)."""
        raise TypeError(f"step {self.step!r} holds no state by key")

    def snapshot(self):
        """The step's state at a checkpoint barrier; None for a stateless step."""
        return None

    def snapshot_since(self, base: int | None):
        """The step's state at a barrier, as what changed since its snapshot of checkpoint
        ``base`` (None: all of it). A step that does not keep track returns all of it."""
        return self.snapshot()

    def restore(self, state) -> None:
        """Continue from :meth:`snapshot`'s state."""

    def data_sinks(self) -> list:
        """The user's sinks the step writes to (their state is divided their way)."""
        return []

    def rescale(self, states: list, index: int, parallelism: int):
        """The state task ``index`` of ``parallelism`` restores from, when a savepoint
        taken with another parallelism is restored: ``states`` are every old task's whole
        :meth:`snapshot`, in task order. A step whose state is grouped by key hands each
        task its key groups (:func:`~gearbus.api.partitioners.owned_groups`), and the first
        task what belongs to no key (counts); any other raises NotRescalable."""
        not_rescalable(states, f"step {self.step!r}")
        return None

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        """A sink step seals its transaction (see DataSink.pre_commit)."""

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """A sink step commits (see DataSink.commit)."""

    def close(self) -> None:
        """Called when the task stops."""

    def state_size(self) -> tuple[int, int]:
        """(live keyed entries, estimated bytes) the step holds, for the metrics; a key in
        several windows counts once per window."""
        return 0, 0

    def _fail(self, values, each, exc: BaseException):
        """Replay ``each`` value by value to find the one the user code fails on."""
        for value in values:
            try:
                each(value)
            except Exception as found:
                raise StepError(self.step, value, found) from found
        raise StepError(self.step, _NO_VALUE, exc) from exc


class ValueOp(Op):
    """A stateless step on values (map, flat_map, filter). :meth:`values` is the fast
    path on bare values, used where timestamps and keys no longer matter."""

    def __init__(self, step, fn):
        super().__init__(step)
        self.fn = fn

    def values(self, vals: list) -> list:
        raise NotImplementedError


class MapOp(ValueOp):
    def process(self, records):
        fn = self.fn
        try:
            return [new_record(Record, (fn(r[0]), r[1], r[2])) for r in records]
        except Exception as exc:
            self._fail(map(_value, records), fn, exc)

    def values(self, vals):
        try:
            return list(map(self.fn, vals))
        except Exception as exc:
            self._fail(vals, self.fn, exc)


class FlatMapOp(ValueOp):
    def process(self, records):
        fn = self.fn
        try:
            return [new_record(Record, (v, r[1], r[2])) for r in records for v in fn(r[0])]
        except Exception as exc:
            self._fail(map(_value, records), lambda v: list(fn(v)), exc)

    def values(self, vals):
        fn = self.fn
        try:
            return [v for x in vals for v in fn(x)]
        except Exception as exc:
            self._fail(vals, lambda v: list(fn(v)), exc)


class FilterOp(ValueOp):
    def process(self, records):
        fn = self.fn
        try:
            return [r for r in records if fn(r[0])]
        except Exception as exc:
            self._fail(map(_value, records), fn, exc)

    def values(self, vals):
        fn = self.fn
        try:
            return [x for x in vals if fn(x)]
        except Exception as exc:
            self._fail(vals, fn, exc)


class ChainedEdge(Partitioner):
    """An edge whose sender first runs stateless steps of the processors behind it, per
    branch: ``branches`` are (ops, partitioner) pairs, each branch's ops run over the batch
    and its partitioner routes what comes out, and every receiver gets the branches'
    records in turn. The planner makes them where stateless steps could not chain into
    their input's processor (several read it, as when one stream is split by kind): the
    records a branch drops never cross the bus, and a stateless stage costs no hop
    (Flink chains such operators into their input's task)."""

    def __init__(self, branches: list[tuple[list[Op], Partitioner]]):
        self.branches = branches
        self.requires_equal_parallelism = any(p.requires_equal_parallelism for _, p in branches)

    def route(self, records: list[Record], num_partitions: int, current_index: int) -> list[list[Record]]:
        if len(self.branches) == 1:
            return self._branch(0, records, num_partitions, current_index)
        routed: list[list[Record]] = [[] for _ in range(num_partitions)]
        for branch in range(len(self.branches)):  # a partitioner may hand back its input list: never extend that
            for bucket, more in zip(routed, self._branch(branch, records, num_partitions, current_index)):
                bucket.extend(more)
        return routed

    def _branch(self, branch: int, records: list[Record], num_partitions: int, current_index: int):
        ops, partitioner = self.branches[branch]
        for op in ops:
            records = op.process(records)
        return partitioner.route(records, num_partitions, current_index)

    def emitting_steps(self) -> list[str] | None:
        """The steps whose output this edge sends (None: the task's own steps' too)."""
        if not all(ops for ops, _ in self.branches):
            return None
        return sorted({ops[-1].step for ops, _ in self.branches})

    def describe(self) -> str:
        return "; ".join(f"{p.describe()} after {', '.join(op.step for op in ops)}" if ops else p.describe()
                         for ops, p in self.branches)


class KeyByOp(ValueOp):
    """group_by's upstream half: computes each record's key for the hash shuffle."""

    def process(self, records):
        fn = self.fn
        try:
            return [new_record(Record, (r[0], r[1], fn(r[0]))) for r in records]
        except Exception as exc:
            self._fail(map(_value, records), fn, exc)


class CombineOp(Op):
    """group_by's upstream half with a map-side combine, for a global-window
    aggregation: keys each value and folds it into a partial aggregate per key, sent as
    ``[accumulator, weight]`` when ``max_keys`` keys are held and at the end of input,
    so each key crosses the shuffle rarely instead of once per record."""

    def __init__(self, step, key_fn, aggregate_step: str, aggregator, max_keys: int, value_ops: list[ValueOp]):
        super().__init__(step)
        self.key_fn = key_fn
        self.aggregate_step = aggregate_step  # failures of the aggregator are reported as this step's
        self.aggregator = aggregator
        self.max_keys = max_keys
        self.value_ops = value_ops  # the stateless steps before it, run on bare values
        self.partials: dict = {}
        self.newest = WATERMARK_MIN

    def process(self, records):
        partials, agg = self.partials, self.aggregator
        vals = list(map(_value, records))
        for op in self.value_ops:
            vals = op.values(vals)
        try:
            keys = list(map(self.key_fn, vals))
        except Exception as exc:
            self._fail(vals, self.key_fn, exc)
        value = _NO_VALUE
        try:
            if type(agg) is Count:  # counting is the common case: do it at C speed
                for key, n in collections.Counter(keys).items():
                    held = partials.get(key)
                    if held is None:
                        partials[key] = [n, n]
                    else:
                        held[0] += n
                        held[1] += n
            else:
                for key, value in zip(keys, vals):
                    held = partials.get(key)
                    if held is None:
                        partials[key] = [agg.add(agg.create(), value), 1]
                    else:
                        held[0] = agg.add(held[0], value)
                        held[1] += 1
        except Exception as exc:
            raise StepError(self.aggregate_step, value, exc) from exc
        newest = max(map(_timestamp, records))
        if newest > self.newest:
            self.newest = newest
        return self._emit() if len(partials) >= self.max_keys else []

    def on_watermark(self, watermark):
        return self._emit() if watermark == WATERMARK_MAX else []

    def snapshot(self):
        # copies: the [accumulator, weight] lists change in place as records arrive
        return {"partials": [(key, list(held)) for key, held in self.partials.items()], "newest": self.newest}

    def restore(self, state) -> None:
        self.partials = dict(state["partials"])
        self.newest = state["newest"]

    def rescale(self, states, index, parallelism):
        """Partials by key group (they cross the shuffle by key whichever task sends them);
        several old tasks' partials of one key merge into one."""
        groups, merged = owned_groups(index, parallelism), {}
        for state in states:
            for key, (acc, weight) in state["partials"]:
                if key_group(key) in groups:
                    held = merged.get(key)
                    merged[key] = [acc, weight] if held is None else \
                        [self.aggregator.merge(held[0], acc), held[1] + weight]
        return {"partials": list(merged.items()), "newest": max(state["newest"] for state in states)}

    def _emit(self) -> list[Record]:
        ts = self.newest
        out = [new_record(Record, (held, ts, key)) for key, held in self.partials.items()]
        self.partials = {}
        return out


class WindowAggregateOp(Op):
    """Keyed, windowed aggregation; emits WindowResult values keyed like their input."""

    def __init__(self, step, make_operator, partial_input: bool, late_sink=None):
        super().__init__(step)
        self.make_operator = make_operator
        self.partial_input = partial_input
        self.late = SinkOp(f"{step}.late", late_sink) if late_sink is not None else None
        self.state_by_owner = self.late is None  # a sink divides what every old task held
        self.operator: WindowOperator | None = None
        self.watermark = WATERMARK_MIN
        self._checkpoint: int | None = None
        self._share = RescaleShare()

    keyed_state = True

    def state_of(self, key) -> tuple[bool, Any]:
        """The key's open windows: start, end and the aggregate's result so far."""
        panes = self.operator.panes_of(key)
        return bool(panes), [{"start": start, "end": end, "value": value} for start, end, value in panes]

    def open(self, task):
        self.operator = self.make_operator()
        self.operator.hold_in(task.state_backend, self.step)
        if self.late is not None:
            self.late.open(task)

    def process(self, records):
        op, wm, out, value = self.operator, self.watermark, [], _NO_VALUE
        try:
            if op.on_disk:
                op.prefetch([(record[2], record[1]) for record in records])
            if self.partial_input:
                for (acc, weight), ts, key in records:
                    out.extend(op.process_partial(key, acc, weight, ts, wm))
            else:
                for value, ts, key in records:
                    out.extend(op.process(key, value, ts, wm))
        except StateBackendError:
            raise
        except Exception as exc:
            raise StepError(self.step, value, exc) from exc
        op.settle()
        if self.late is not None:
            self.late.process([new_record(Record, (v, ts, k)) for k, v, ts in self.operator.drain_late()])
        return self._records(out)

    def close(self):
        if self.late is not None:
            self.late.close()

    def snapshot(self):
        return self._state(self.operator.snapshot(self.step))

    def snapshot_since(self, base: int | None):
        """The whole state, or (building on ``base``'s snapshot) a WindowDelta of the
        panes changed since, the rest whole: its cost follows the panes changed."""
        changes = self.operator.changes_since(self.step, self._checkpoint, self._share.base(base))
        if changes is None:
            return self.snapshot()
        return self._share.whole(WindowDelta(*changes, self._state(self.operator.snapshot_rest())))

    def _state(self, operator: dict) -> dict:
        """The step's state around the operator's."""
        return {"operator": operator, "watermark": self.watermark,
                "late": self.late.snapshot() if self.late is not None else None}

    def restore(self, state) -> None:
        self.operator.restore(state["operator"])
        self._share.restored(state, state["operator"]["groups"], self.operator.changes)
        self.watermark = state["watermark"]
        if self.late is not None:
            self.late.restore(state["late"])

    def data_sinks(self):
        return self.late.data_sinks() if self.late is not None else []

    def rescale(self, states, index, parallelism):
        operators = [None if state is None else state["operator"] for state in states]
        return {"operator": WindowOperator.rescale(operators, index, parallelism),
                "watermark": min(state["watermark"] for state in states if state is not None),
                "late": self.late.rescale([state["late"] for state in states], index, parallelism)
                if self.late is not None else None}

    def prepare_checkpoint(self, checkpoint_id):
        self._checkpoint = checkpoint_id
        if self.late is not None:
            self.late.prepare_checkpoint(checkpoint_id)

    def checkpoint_complete(self, checkpoint_id):
        if self.late is not None:
            self.late.checkpoint_complete(checkpoint_id)

    def on_watermark(self, watermark):
        self.watermark = watermark
        try:
            results = self.operator.advance(watermark)
        except StateBackendError:
            raise
        except Exception as exc:
            raise StepError(self.step, _NO_VALUE, exc) from exc
        self.operator.settle()
        return self._records(results)

    @staticmethod
    def _records(results) -> list[Record]:
        """A result's event time is its window's last instant (as Flink does)."""
        return [new_record(Record, (r, min(r.window_end - 1, WATERMARK_MAX - 1), r.key)) for r in results]

    @property
    def late_records(self) -> int:
        """Records too late for their window: dropped, or sent to the late sink."""
        op = self.operator
        return op.late_dropped + op.late_side_output if op else 0

    def state_size(self):
        op = self.operator
        return (op.state_size, op.state_bytes) if op else (0, 0)


class SinkOp(Op):
    def __init__(self, step, data_sink):
        super().__init__(step)
        self.data_sink = data_sink
        self.sink = None

    def open(self, task):
        self.sink = copy.deepcopy(self.data_sink)  # one per task
        self.sink.open(task.context)

    def process(self, records):
        if records:
            try:
                self.sink.write(records)
            except Exception as exc:
                raise StepError(self.step, _NO_VALUE, exc) from exc
        return []

    def snapshot(self):
        return self.sink.snapshot()

    def restore(self, state) -> None:
        self.sink.restore(state)

    def data_sinks(self):
        return [self.data_sink]

    def rescale(self, states, index, parallelism):
        return self.data_sink.rescale(states, index, parallelism)

    def prepare_checkpoint(self, checkpoint_id):
        self.sink.pre_commit(checkpoint_id)

    def checkpoint_complete(self, checkpoint_id):
        self.sink.commit(checkpoint_id)

    def close(self):
        if self.sink is not None:
            self.sink.close()
            self.sink = None


class StreamWriteOp(SinkOp):
    """Writes an intermediate stream (gearbus/connectors/intermediate.py): a sink that
    passes each watermark on to the stream's readers."""

    def on_watermark(self, watermark):
        self.sink.on_watermark(watermark)
        return []


class ChainTask(Task):
    """Runs a processor's chained steps (``config["ops"]``) over each batch."""

    def on_start(self) -> None:
        context = self.context
        #: where the steps keep their keyed state (closed, and its files removed, on stop)
        self.state_backend = open_backend(context.state_backend, context.state_dir,
                                          f"p{context.processor_id}-t{context.index}-e{context.epoch}",
                                          owned_groups(context.index, context.processor.parallelism)
                                          if context.local_copies else None)
        self.ops: list[Op] = copy.deepcopy(self.context.config["ops"])  # fresh state per task
        #: the ops that release output later, and those that ask for wakeups (by position)
        self.holding = [i for i, op in enumerate(self.ops) if op.holds_output]
        self.timed = [i for i, op in enumerate(self.ops) if type(op).next_wakeup_ms is not Op.next_wakeup_ms]
        try:
            for op in self.ops:
                op.open(self)
        except BaseException:
            self.state_backend.close()  # no on_stop follows a failed start
            raise

    def on_batch(self, records):
        for op in self.ops:
            if not records:
                return
            records = op.process(records)
        self.output.extend(records)

    def on_watermark(self, watermark):
        self.output.extend(self._through(0, [], watermark))

    def _through(self, start: int, carried: list[Record], watermark: int | None = None) -> list[Record]:
        """``carried`` records, then ``watermark`` (if any), through the ops from ``start``
        on; the watermark stops at an op still holding records before it, which releases
        it later (:meth:`poll`), so the ops after it see records and watermarks in order."""
        for op in self.ops[start:]:
            if carried:
                carried = op.process(carried)
            if watermark is not None:
                carried = carried + op.on_watermark(watermark)
                if op.holds_output and op.pending():
                    watermark = None
        return carried

    def poll(self):
        for i in self.holding:
            for records, watermark in self.ops[i].poll():
                self.output.extend(self._through(i + 1, records, watermark))

    def pending(self):
        return any(self.ops[i].pending() for i in self.holding)

    def full(self):
        return any(self.ops[i].full() for i in self.holding)

    def output_watermark(self, watermark):
        """What the last op holding output released: it passed every op before it."""
        return self.ops[self.holding[-1]].released if self.holding else watermark

    def next_wakeup_ms(self):
        return min((due for i in self.timed if (due := self.ops[i].next_wakeup_ms()) is not None), default=None)

    def on_wakeup(self, now_ms):
        """The due ops in chain order, each one's output through the ops after it."""
        for i in self.timed:
            due = self.ops[i].next_wakeup_ms()
            if due is not None and due <= now_ms:
                self.output.extend(self._through(i + 1, self.ops[i].on_wakeup(now_ms)))

    def snapshot(self):
        """Each stateful step's state, by step name (so a changed pipeline can match it)."""
        return self.snapshot_since(None)

    def snapshot_since(self, base: int | None):
        """:meth:`snapshot`, each step's as what changed since checkpoint ``base`` if it can
        (see gearbus/runtime/snapshots.py)."""
        return {op.step: state for op in self.ops if (state := op.snapshot_since(base)) is not None}

    def builds_on_base(self, snapshot) -> bool:
        """Whether ``snapshot`` (of :meth:`snapshot_since`) holds some step's changes only,
        not the whole state: a whole one starts a chain of its own."""
        return any(isinstance(state, Delta) for state in snapshot.values())

    def restore(self, state) -> None:
        by_step = {op.step: op for op in self.ops}
        unknown = sorted(set(state) - set(by_step))
        if unknown:
            raise RestoreError(f"the checkpoint holds state of step(s) {', '.join(map(repr, unknown))}, "
                               f"which processor {self.context.processor_name!r} does not have "
                               f"(its steps: {', '.join(map(repr, by_step))})")
        for step, op_state in state.items():
            by_step[step].restore(op_state)

    def prepare_checkpoint(self, checkpoint_id):
        for op in self.ops:
            op.prepare_checkpoint(checkpoint_id)

    def keep_copy(self, checkpoint_id: int) -> tuple[str, ...]:
        """A local copy of the state on disk at ``checkpoint_id``'s snapshot, just taken
        (see gearbus/runtime/local_copies.py): its locator, if the backend keeps one."""
        return self.state_backend.keep_copy(checkpoint_id)

    def offer_copies(self, locators: tuple[str, ...]) -> None:
        """The local copies the restore that follows may take state from."""
        self.state_backend.offer(locators)

    def checkpoint_complete(self, checkpoint_id):
        for op in self.ops:
            op.checkpoint_complete(checkpoint_id)
        self.state_backend.completed(checkpoint_id)

    def on_stop(self):
        try:
            for op in getattr(self, "ops", []):
                op.close()
        finally:
            if hasattr(self, "state_backend"):
                self.state_backend.close()

    @property
    def late_records(self) -> int:
        return sum(getattr(op, "late_records", 0) for op in getattr(self, "ops", []))

    def state_size(self) -> tuple[int, int]:
        """The task's stateful steps' (keyed entries, estimated bytes), summed."""
        sizes = [op.state_size() for op in getattr(self, "ops", [])]
        return sum(k for k, _ in sizes), sum(b for _, b in sizes)


class ChainSourceTask(ChainTask, DataSourceTask):
    """A source processor with chained steps; ``timestamp_fn`` sets event times first."""

    def on_start(self) -> None:
        DataSourceTask.on_start(self)
        ChainTask.on_start(self)
        self.timestamp_fn = self.context.config.get("timestamp_fn")

    def snapshot_since(self, base: int | None):
        return {"source": DataSourceTask.snapshot(self), "steps": ChainTask.snapshot_since(self, base)}

    def builds_on_base(self, snapshot) -> bool:
        return ChainTask.builds_on_base(self, snapshot["steps"])

    def prepare_checkpoint(self, checkpoint_id):
        DataSourceTask.prepare_checkpoint(self, checkpoint_id)
        ChainTask.prepare_checkpoint(self, checkpoint_id)

    def checkpoint_complete(self, checkpoint_id):
        ChainTask.checkpoint_complete(self, checkpoint_id)
        DataSourceTask.checkpoint_complete(self, checkpoint_id)

    def restore(self, state) -> None:
        if state["source"] is not None:  # None: restored from a savepoint that had no state for it
            DataSourceTask.restore(self, state["source"])
        ChainTask.restore(self, state["steps"])

    def stamp(self, records):
        fn = self.timestamp_fn
        if fn is None:
            return records
        try:
            return [new_record(Record, (r[0], int(fn(r[0])), r[2])) for r in records]
        except Exception as exc:
            Op(self.context.config["steps"][0])._fail(map(_value, records), lambda v: int(fn(v)), exc)

    def on_stop(self) -> None:
        ChainTask.on_stop(self)
        DataSourceTask.on_stop(self)
