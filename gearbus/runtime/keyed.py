"""Keyed state and timers: the operators behind ``process_keyed`` and ``stateful_map``.

Pure computation driven by records, watermarks and the clock (no I/O), so the TestRunner
and the executors run the same code. State lives per key, bounded by an optional
event-time TTL; timers are kept per key and in heaps by time. Snapshots group every
key's state and timers by key group, as the window operator does.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, MutableMapping
from heapq import heappop, heappush
from operator import is_not
from typing import Any

from gearbus.api.keyed import KeyedContext
from gearbus.api.task import Record, new_record, now_ms
from gearbus.api.watermarks import WATERMARK_MIN
from gearbus.runtime.chain import Op, StepError
from gearbus.api.partitioners import key_group, key_groups
from gearbus.runtime.keygroups import (IMMUTABLE_TYPES, ChangeLog, Changes, Columns, Groups, KeyedDelta, RescaleShare,
                                       any_none, detached, group_fields, grouped, in_layers, keyed_share)
from gearbus.runtime.state_backend import StateBackendError, held_bytes, settle_of


TIMER_BYTES = 16  # a timer's share of the state size metric
_NONE = object()


class KeyedStates:
    """Each key's state, and when it was last written (event time) for the TTL: a key
    not written for ``ttl_ms`` is forgotten once the watermark reaches the last write +
    ``ttl_ms``. Every key written goes into ``changed`` with its state, every key
    forgotten with None (:class:`Changes`).

    ``values`` is the state backend's table for the step (a dict in memory); a table that
    writes back is settled between batches."""

    def __init__(self, step: str, ttl_ms: int | None, changed: Changes, values: MutableMapping | None = None):
        self.step = step
        self.ttl_ms = ttl_ms
        self.changed = changed
        self.values: MutableMapping = {} if values is None else values
        self.settle = settle_of(self.values)
        #: a table on disk reads a batch's keys in one go
        self.prefetch = getattr(self.values, "prefetch", None)
        self.load = getattr(self.values, "load", None)  # puts back a group's entries at once (see restore_columns)
        #: takes key groups from local copies on restore (a table on disk that keeps them)
        self.adopt = getattr(self.values, "adopt", None)
        #: reads for a snapshot: a table that writes back does not keep what they read
        self._peek = getattr(self.values, "peek", self.values.get)
        self.written: dict[Any, int] = {}  # key -> event time of its last write (with a TTL)
        self._expiry: list[tuple[int, int, Any]] = []  # (expires at, tie-breaker, key); stale ones skipped
        self._order = itertools.count()

    def put(self, key, value, timestamp: int) -> None:
        self.changed[key] = value
        if value is None:
            self.values.pop(key, None)
            self.written.pop(key, None)
            return
        self.values[key] = value
        if self.ttl_ms is not None:
            self.written[key] = timestamp
            heappush(self._expiry, (timestamp + self.ttl_ms, next(self._order), key))

    def expire(self, watermark: int) -> None:
        expiry, written, ttl = self._expiry, self.written, self.ttl_ms
        while expiry and expiry[0][0] <= watermark:
            expires, _, key = heappop(expiry)
            last = written.get(key)
            if last is not None and last + ttl == expires:  # not written again since
                del written[key]
                del self.values[key]
                self.changed[key] = None

    def entry(self, key) -> tuple:
        """What a snapshot keeps of ``key``: its state and the time of its last write."""
        return self.entry_of(key, self._peek(key))

    def entry_of(self, key, value) -> tuple:
        """:meth:`entry`, the key's state read already."""
        return detached(value, self.step, key), self.written.get(key)

    def delta(self, changed: Changes) -> tuple[Columns, dict[int, list]]:
        """The ``changed`` keys: (written: the entries ``(key, state, written)`` of the keys
        held, removed: the others, by key group). The states written are taken as they are
        (copied when they can change); only a key without one is read: a checkpoint's cost
        on the task's path follows the keys changed, and mostly without touching the state."""
        if any_none(changed.values()) or not IMMUTABLE_TYPES.issuperset(map(type, changed.values())):
            keys, states, removed = self._read(changed)
        else:
            keys, states, removed = list(changed), list(changed.values()), {}
        times = list(map(self.written.get, keys)) if self.ttl_ms is not None else None
        return Columns(keys, states, times, bytes(key_groups(keys))), removed

    def _read(self, changed: Changes) -> tuple[list, list, dict[int, list]]:
        """(keys held, their states, the keys removed by key group) when some keys must be
        read or their states copied: a key at a time."""
        peek, step = self._peek, self.step
        keys, states, removed = [], [], {}
        for key, value in changed.items():
            if value is None and (value := peek(key, _NONE)) is _NONE:
                removed.setdefault(key_group(key), []).append(key)
                continue
            keys.append(key)
            states.append(value if type(value) in IMMUTABLE_TYPES else detached(value, step, key))
        return keys, states, removed

    def holds(self, key) -> bool:
        """Whether the key has state (a read that keeps nothing)."""
        return self._peek(key, _NONE) is not _NONE

    def restore(self, key, value, written: int | None, watermark: int) -> None:
        """Put back a snapshot's entry; one taken without a TTL counts as written at ``watermark``."""
        if value is not None:
            self.put(key, value, watermark if written is None else written)

    def restore_columns(self, keys: list, states: list, written: list | None, watermark: int,
                        fresh_group: int | None = None) -> None:
        """Put back a key group's snapshot entries ``(key, state, written)``, given as
        columns (``written`` None: all None): in one update when no TTL needs their write
        times (a restore resets the change log after), loaded straight into a table that
        can (``fresh_group``: the group, of which the state holds no key yet); a state
        None is not put back."""
        if self.ttl_ms is None:
            if any_none(states):
                keys = list(itertools.compress(keys, map(is_not, states, itertools.repeat(None))))
                states = [state for state in states if state is not None]
            if fresh_group is not None and self.load is not None:
                self.load(fresh_group, keys, states)
            else:
                self.values.update(zip(keys, states))
            return
        for key, value, at in zip(keys, states, itertools.repeat(None) if written is None else written):
            self.restore(key, value, at, watermark)

    def forget(self, keys: list) -> None:
        """Remove ``keys`` (a restore applying a snapshot's removals)."""
        values, written = self.values, self.written
        for key in keys:
            values.pop(key, None)
            written.pop(key, None)

    @property
    def size(self) -> tuple[int, int]:
        """(keys, estimated bytes)."""
        values = self.values
        return len(values), held_bytes([values], lambda: iter(values.items()), len(values))


class Timers:
    """One time domain's timers: a set of times per key, and a heap to fire them in
    order (deleted timers stay in the heap and are skipped). Every key whose timers
    change goes into ``changed``."""

    def __init__(self, changed: Changes):
        self.changed = changed
        self.by_key: dict[Any, set[int]] = {}
        self.count = 0
        self._heap: list[tuple[int, int, Any]] = []  # (time, tie-breaker, key): keys are never compared
        self._order = itertools.count()

    def register(self, key, timestamp: int) -> None:
        times = self.by_key.setdefault(key, set())
        if timestamp not in times:
            times.add(timestamp)
            self.count += 1
            self.changed.add(key)
            heappush(self._heap, (timestamp, next(self._order), key))

    def delete(self, key, timestamp: int) -> None:
        times = self.by_key.get(key)
        if times is not None and timestamp in times:
            times.remove(timestamp)
            self.count -= 1
            self.changed.add(key)
            if not times:
                del self.by_key[key]

    def next_time(self) -> int | None:
        heap = self._heap
        while heap and heap[0][0] not in self.by_key.get(heap[0][2], ()):
            heappop(heap)
        return heap[0][0] if heap else None

    def pop_due(self, until: int) -> tuple[Any, int] | None:
        """The next (key, time) with time <= ``until``, removed; None when there is none."""
        heap = self._heap
        while heap and heap[0][0] <= until:
            timestamp, _, key = heappop(heap)
            times = self.by_key.get(key)
            if times is not None and timestamp in times:
                self.delete(key, timestamp)
                return key, timestamp
        return None

    def entry(self, key) -> list[int]:
        return sorted(self.by_key.get(key, ()))


class KeyedOp(Op):
    """A step with per-key state (and, in subclasses, timers), after a ``group_by``."""

    state_by_owner = True
    #: whether a restore may take the table from local copies (gearbus/runtime/local_copies.py),
    #: as it may without a TTL (whose write times come from each entry): see :meth:`open`
    adopts_copies = True

    def __init__(self, step: str, ttl_ms: int | None):
        super().__init__(step)
        self.ttl_ms = ttl_ms
        self.changes = ChangeLog()
        self.states = KeyedStates(step, ttl_ms, self.changes.changed)
        self.watermark = WATERMARK_MIN
        self._checkpoint: int | None = None
        self._share = RescaleShare()

    def open(self, task) -> None:
        """Hold the keyed state in the task's state backend (kept in local copies when a
        restore can take it from them)."""
        table = task.state_backend.table(self.step, copied=self.adopts_copies and self.ttl_ms is None)
        self.states = KeyedStates(self.step, self.ttl_ms, self.changes.changed, table)

    def on_watermark(self, watermark: int) -> list[Record]:
        self.watermark = watermark
        if self.ttl_ms is not None:
            self.states.expire(watermark)
            self.states.settle()
        self.changes.bound(self._held())
        return []

    def _held(self) -> int:
        """About how many keys the step holds (what its change log is bounded by)."""
        return len(self.states.values)

    keyed_state = True

    def state_of(self, key) -> tuple[bool, Any]:
        """The key's state, as the step's function last left it."""
        return key in self.states.values, self.states.values.get(key)

    def _entries(self):
        """Every key held, with its entry: one pass over the state."""
        states = self.states
        return ((key, states.entry_of(key, value)) for key, value in states.values.items())

    def _holds(self, key) -> bool:
        return key in self.states.values

    def _entry(self, key) -> tuple:
        return self.states.entry(key)

    def _restore_entry(self, key, entry: tuple) -> None:
        self.states.restore(key, entry[0], entry[1], self.watermark)

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        self._checkpoint = checkpoint_id

    def snapshot(self):
        return self.snapshot_since(None)

    def snapshot_since(self, base: int | None):
        """Every key's entry by key group, or (building on ``base``'s snapshot) a
        :class:`KeyedDelta` of the keys changed since: its cost follows the changes. After
        a rescale the first whole one is its share of the old tasks' snapshots with the
        changes since (their stored bytes taken again as they are for the key groups not
        changed, as a compaction does), not a pass over every key held."""
        changed = self.changes.take(self._checkpoint, self._share.base(base), self._held())
        if changed is None:
            groups: dict[int, list] = {}
            for key, entry in self._entries():
                groups.setdefault(key_group(key), []).append((key, *entry))
            return {"watermark": self.watermark, "groups": Groups(groups)}
        return self._share.whole(KeyedDelta(self.watermark, *self._delta(changed)))

    def _delta(self, changed: Changes) -> tuple[Mapping[int, list[tuple]], dict[int, list]]:
        """The ``changed`` keys: (written entries, removed keys), by key group."""
        return self.states.delta(changed)

    def restore(self, state) -> None:
        values = self.states.values
        values.clear()
        self.states = KeyedStates(self.step, self.ttl_ms, self.changes.changed, values)
        self.watermark = state["watermark"]
        self._restore_groups(state["groups"], self.states.adopt() if self.states.adopt is not None else frozenset())
        self.changes.reset()
        self._share.restored(state, state["groups"], self.changes)

    def _restore_groups(self, groups: Mapping[int, list], adopted: frozenset[int]) -> None:
        """Put back a snapshot's groups: a chain's layers one after another, straight into
        the state (its dict is the only index they need), a key group at a time (one in
        memory at a time), a delta's columns as they are. A table on disk takes each group
        added up instead (a column at a time), each key loaded once: a layer's keys written
        again would each cost a lookup in a store being written (over half a restore's time
        with a chain of eight changes of 30,000 keys over 200,000); the groups it
        ``adopted`` from local copies are not read."""
        states = self.states
        if states.load is not None:
            for group in sorted(groups):
                if group in adopted:
                    continue
                if fields := group_fields(groups, group):
                    states.restore_columns(*fields, self.watermark, group)
                states.settle()
            return
        for removed, written in in_layers(groups):
            for group in sorted(removed):
                states.forget(removed[group])
            if isinstance(written, Columns):
                states.restore_columns(*written.columns(), self.watermark)
                states.settle()
                continue
            for group in sorted(written):
                if fields := group_fields(written, group):
                    states.restore_columns(*fields, self.watermark)
                states.settle()

    def rescale(self, states, index, parallelism):
        return keyed_share(states, index, parallelism)

    def state_size(self) -> tuple[int, int]:
        return self.states.size


class StatefulMapOp(KeyedOp):
    """``stateful_map``: ``fn(state, value) -> (state, out)`` per record; ``out`` goes on
    keyed by the record's key, a returned state of None forgets the key."""

    def __init__(self, step: str, fn, ttl_ms: int | None):
        super().__init__(step, ttl_ms)
        self.fn = fn

    def process(self, records):
        fn, states = self.fn, self.states
        values, put, out = states.values, states.put, []
        if states.prefetch is not None:
            states.prefetch([record[2] for record in records])
        for value, timestamp, key in records:
            try:
                returned = fn(values.get(key), value)
            except StateBackendError:
                raise
            except Exception as exc:
                raise StepError(self.step, value, exc) from exc
            if type(returned) not in (tuple, list) or len(returned) != 2:
                raise StepError(self.step, value, TypeError(
                    f"a stateful_map function must return a pair (new state, output), got {returned!r}"))
            put(key, returned[0], timestamp)
            out.append(new_record(Record, (returned[1], timestamp, key)))
        states.settle()
        self.changes.bound(len(values))
        return out


class _Context(KeyedContext):
    """The context handed to the user's function; the operator sets its fields per call."""

    def __init__(self, op: KeyedProcessOp):
        self._op = op
        self.out: list[Record] = []
        self.emit_time = 0  # an emit's default time

    @property
    def state(self):
        """The key's state; one that can change in place counts as written (a user may
        change it without assigning it back)."""
        value = self._op.states.values.get(self.key)
        if value is not None and type(value) not in IMMUTABLE_TYPES:
            self._op.changes.changed[self.key] = value  # the object the user changes
        return value

    @state.setter
    def state(self, value) -> None:
        self._op.states.put(self.key, value, self.emit_time)

    def emit(self, value, timestamp: int | None = None) -> None:
        self.out.append(new_record(Record, (value, self.emit_time if timestamp is None else timestamp, self.key)))

    def register_event_time_timer(self, timestamp: int) -> None:
        self._op.timers(self._op.event_timers).register(self.key, _millis(timestamp))

    def delete_event_time_timer(self, timestamp: int) -> None:
        self._op.event_timers.delete(self.key, timestamp)

    def register_processing_time_timer(self, timestamp: int) -> None:
        self._op.timers(self._op.processing_timers).register(self.key, _millis(timestamp))

    def delete_processing_time_timer(self, timestamp: int) -> None:
        self._op.processing_timers.delete(self.key, timestamp)

    def processing_time(self) -> int:
        return self._op.clock()


def _millis(timestamp) -> int:
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise TypeError(f"a timer's time must be an int of epoch milliseconds, got {timestamp!r}")
    return timestamp


class KeyedProcessOp(KeyedOp):
    """``process_keyed``: the user's function (or KeyedProcessFunction) per record, with
    the key's state and timers; event-time timers fire as the watermark passes them,
    processing-time ones when the task's clock does."""

    def __init__(self, step: str, function, ttl_ms: int | None):
        super().__init__(step, ttl_ms)
        self.function = function
        self.event_timers = Timers(self.changes.changed)
        self.processing_timers = Timers(self.changes.changed)

    def open(self, task) -> None:
        super().open(task)
        function = self.function
        if isinstance(function, type):
            instance = function()
            instance.open(task.context)
            self._process, self._on_timer = instance.process, instance.on_timer
        else:
            self._process, self._on_timer = function, None
        #: The driver's clock (the TestRunner's is simulated), the wall clock without a task.
        self.clock = task.context.now_ms if task.context is not None else now_ms
        self.ctx = _Context(self)

    def timers(self, timers: Timers) -> Timers:
        """``timers``, when there is an ``on_timer`` to call."""
        if self._on_timer is None:
            raise TypeError("timers need an on_timer method: pass a KeyedProcessFunction subclass to process_keyed")
        return timers

    def process(self, records):
        ctx, process = self.ctx, self._process
        out = ctx.out = []
        ctx.watermark = self.watermark
        if self.states.prefetch is not None:
            self.states.prefetch([record[2] for record in records])
        for value, timestamp, key in records:
            ctx.key, ctx.timestamp, ctx.emit_time = key, timestamp, timestamp
            try:
                process(value, ctx)
            except StateBackendError:
                raise
            except Exception as exc:
                raise StepError(self.step, value, exc) from exc
        self.states.settle()
        self.changes.bound(self._held())
        return out

    def on_watermark(self, watermark):
        out = self._fire(self.event_timers, watermark, watermark, event_time=True)
        super().on_watermark(watermark)
        return out

    def next_wakeup_ms(self) -> int | None:
        return self.processing_timers.next_time()

    def on_wakeup(self, now: int) -> list[Record]:
        return self._fire(self.processing_timers, now, self.watermark, event_time=False)

    def _fire(self, timers: Timers, until: int, watermark: int, event_time: bool) -> list[Record]:
        """Call on_timer for every due timer in time order (timers set meanwhile for a due
        time fire too); an event-time timer's output carries its time, a processing-time
        one's the earliest time that is not late downstream."""
        ctx = self.ctx
        out = ctx.out = []
        ctx.watermark = watermark
        while (due := timers.pop_due(until)) is not None:
            key, timestamp = due
            ctx.key, ctx.timestamp = key, timestamp
            ctx.emit_time = timestamp if event_time else self.watermark + 1
            try:
                self._on_timer(timestamp, ctx)
            except StateBackendError:
                raise
            except Exception as exc:
                raise StepError(self.step, f"<timer at {timestamp} of key {key!r}>", exc) from exc
        self.states.settle()
        return out

    def _entries(self):
        """Every key with state, then every key with timers alone."""
        event, processing = self.event_timers, self.processing_timers
        for key, (value, written) in super()._entries():
            yield key, (value, written, event.entry(key), processing.entry(key))
        for key in event.by_key.keys() | processing.by_key.keys():
            if not self.states.holds(key):
                yield key, self._entry(key)

    def _holds(self, key) -> bool:
        return key in self.states.values or key in self.event_timers.by_key or key in self.processing_timers.by_key

    def _held(self) -> int:
        return len(self.states.values) + len(self.event_timers.by_key) + len(self.processing_timers.by_key)

    def _delta(self, changed: Changes) -> tuple[Mapping[int, list[tuple]], dict[int, list]]:
        """A key is held while it has state or timers; its entry carries both."""
        return grouped(changed, self._holds, self._entry)

    def _entry(self, key) -> tuple:
        return (*self.states.entry(key), self.event_timers.entry(key), self.processing_timers.entry(key))

    def restore(self, state) -> None:
        self.event_timers, self.processing_timers = Timers(self.changes.changed), Timers(self.changes.changed)
        super().restore(state)

    adopts_copies = False  # each entry's timers are read anyway

    def _restore_groups(self, groups: Mapping[int, list], adopted: frozenset[int]) -> None:
        """Each key group added up first: a later layer's timers replace a key's, not add to them."""
        for group in sorted(groups):
            for key, *entry in groups[group]:
                self._restore_entry(key, tuple(entry))
            self.states.settle()

    def _restore_entry(self, key, entry: tuple) -> None:
        super()._restore_entry(key, entry)
        value, written, event_times, processing_times = entry
        for timestamp in event_times:
            self.event_timers.register(key, timestamp)
        for timestamp in processing_times:
            self.processing_timers.register(key, timestamp)

    def state_size(self) -> tuple[int, int]:
        """Keys with state (or timers: a lower bound, counted without a pass over the
        keys); the states' bytes plus about TIMER_BYTES per timer."""
        keys, size = self.states.size
        event, processing = self.event_timers, self.processing_timers
        keys = max(keys, len(event.by_key), len(processing.by_key))
        return keys, size + TIMER_BYTES * (event.count + processing.count)

