"""Join operators (semantics in :mod:`gearbus.api.joins`): pure computation over records
and watermarks, run by every runner, with state grouped by key group in snapshots.

Both inputs of a join reach its tasks through hash edges keyed by the join key (the
planner co-partitions them with the join's parallelism): :class:`JoinInputOp`, at the
end of each input's processor, keys every record and tags it with its side, so a join
task sees ``((side, value), timestamp, key)`` records, side 0 left and 1 right.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Callable, MutableMapping
from heapq import heappop, heappush
from operator import itemgetter
from typing import Any

from gearbus.api.aggregators import Aggregator
from gearbus.api.joins import Joined
from gearbus.api.task import Record, new_record
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.chain import Op, StepError, WindowAggregateOp
from gearbus.api.partitioners import key_group, owned_groups
from gearbus.runtime.keygroups import ChangeLog, Groups, JoinDelta, RescaleShare, estimated_bytes, inherited, keyed_share
from gearbus.runtime.state_backend import held_bytes, settle_of

LEFT, RIGHT = 0, 1
_value = itemgetter(0)
#: ``_pair(Joined, (left, right))`` builds a Joined at C speed (see task.new_record).
_pair = tuple.__new__
#: Key types known to be hashable without hashing each key.
_HASHABLE = frozenset({int, str, bytes, float, bool})


class JoinInputOp(Op):
    """One input's half of a join: keys each record and tags its side."""

    def __init__(self, step: str, side: int, key_fn: Callable[[Any], Any]):
        super().__init__(step)
        self.side = side
        self.key_fn = key_fn

    def process(self, records):
        fn, side = self.key_fn, self.side
        try:
            keys = [fn(r[0]) for r in records]
        except Exception as exc:
            self._fail(map(_value, records), fn, exc)
        if not _HASHABLE.issuperset(map(type, keys)):
            self._check_keys(records, keys)
        return [new_record(Record, ((side, r[0]), r[1], k)) for r, k in zip(records, keys)]

    def _check_keys(self, records, keys) -> None:
        """Name the record whose key cannot be joined on: None, or not hashable."""
        for record, key in zip(records, keys):
            if key is None:
                raise StepError(self.step, record[0], ValueError(
                    "its join key is None: records without a key cannot be joined (filter them out first)"))
            try:
                hash(key)
            except TypeError:
                raise StepError(self.step, record[0], TypeError(
                    f"its join key {key!r} is of unhashable type {type(key).__name__} "
                    "(return a tuple instead of a list, say)")) from None


class CoGroup(Aggregator):
    """Both sides' values of a key in a window: ``[lefts, rights]``."""

    def create(self) -> list:
        return [[], []]

    def add(self, acc: list, item) -> list:
        acc[item[0]].append(item[1])
        return acc

    def merge(self, a: list, b: list) -> list:
        a[0].extend(b[0])
        a[1].extend(b[1])
        return a


def window_pairs(lefts: list, rights: list, how: str) -> list[Joined]:
    """The joined pairs of one key's window: every left with every right, plus the
    unmatched side(s) paired with None as ``how`` asks."""
    if lefts and rights:
        return [_pair(Joined, (left, right)) for left in lefts for right in rights]
    if lefts and how in ("left", "outer"):
        return [_pair(Joined, (left, None)) for left in lefts]
    if rights and how in ("right", "outer"):
        return [_pair(Joined, (None, right)) for right in rights]
    return []


class WindowJoinOp(WindowAggregateOp):
    """A window join: a window operator co-grouping both sides per key and window, whose
    panes become pairs stamped with the window's last instant when the window closes."""

    def __init__(self, step: str, make_operator, how: str):
        super().__init__(step, make_operator, False, None)
        self.how = how

    def _records(self, results) -> list[Record]:
        how, out = self.how, []
        for r in results:
            lefts, rights = r.value
            timestamp = min(r.window_end - 1, WATERMARK_MAX - 1)
            out.extend(new_record(Record, (pair, timestamp, r.key)) for pair in window_pairs(lefts, rights, how))
        return out


class _Buffer:
    """One side's records of one key, sorted by timestamp."""

    __slots__ = ("times", "values")

    def __init__(self, times: list[int] | None = None, values: list | None = None):
        self.times = times or []
        self.values = values or []

    def __reduce__(self):
        return _Buffer, (self.times, self.values)

    def insert(self, timestamp: int, value) -> None:
        i = bisect_right(self.times, timestamp)
        self.times.insert(i, timestamp)
        self.values.insert(i, value)

    def between(self, low: int, high: int):
        """(timestamp, value) of the records with low <= timestamp <= high."""
        times = self.times
        lo, hi = bisect_left(times, low), bisect_right(times, high)
        return zip(times[lo:hi], self.values[lo:hi])

    def drop_until(self, timestamp: int) -> int:
        """Forget the records with a timestamp <= ``timestamp``; return how many."""
        i = bisect_right(self.times, timestamp)
        del self.times[:i]
        del self.values[:i]
        return i


class _IncrementalJoin(Op):
    """A join whose snapshots hold what changed since the one they build on
    (:class:`JoinDelta`): the entries of the buffers (or versions) written and removed,
    told apart by their first :attr:`IDENTITY` fields, the rest whole. A subclass marks
    each identity it changes in ``self.changes.changed``."""

    IDENTITY = 1
    state_by_owner = True

    def __init__(self, step: str):
        super().__init__(step)
        self.changes = ChangeLog()
        self._checkpoint: int | None = None
        self._share = RescaleShare()

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        self._checkpoint = checkpoint_id

    def snapshot(self):
        return self.snapshot_since(None)

    def snapshot_since(self, base: int | None):
        """The whole state, or (building on ``base``'s snapshot) a JoinDelta: its cost
        follows what changed."""
        changed = self.changes.take(self._checkpoint, self._share.base(base), self._identities_held())
        if changed is None:
            return {**self._rest(), "groups": Groups(self._groups())}
        written: dict[int, list[tuple]] = {}
        removed: dict[int, list[tuple]] = {}
        for identity in changed:
            entry = self._entry(identity)
            group = key_group(identity[-1])
            if entry is None:
                removed.setdefault(group, []).append(identity)
            else:
                written.setdefault(group, []).append(entry)
        return self._share.whole(JoinDelta(written, removed, self.IDENTITY, self._rest()))

    def _identities_held(self) -> int:
        raise NotImplementedError

    def _rest(self) -> dict:
        """The snapshot without its groups."""
        raise NotImplementedError

    def _groups(self) -> dict[int, list]:
        """Every entry, by key group."""
        raise NotImplementedError

    def _entry(self, identity: tuple) -> tuple | None:
        """The entry of ``identity``; None when it holds nothing."""
        raise NotImplementedError


class IntervalJoinOp(_IncrementalJoin):
    """An interval join: left ``l`` and right ``r`` of one key pair up when
    ``l.ts + lower <= r.ts <= l.ts + upper``, as soon as the second one arrives. A left
    record is kept until the watermark reaches ``l.ts + upper`` and a right one until
    ``r.ts - lower``: after that nothing that can still arrive matches it."""

    IDENTITY = 2  # (side, key)

    def __init__(self, step: str, lower_ms: int, upper_ms: int):
        super().__init__(step)
        self.lower, self.upper = lower_ms, upper_ms
        #: each side's records by key (tables of the task's state backend once open)
        self.sides: tuple[MutableMapping[Any, _Buffer], MutableMapping[Any, _Buffer]] = ({}, {})
        self._settles = ()
        self._reset()

    def open(self, task) -> None:
        """Hold each side's records in the task's state backend (the times they expire at
        stay in memory)."""
        backend = task.state_backend
        self.sides = (backend.table(f"{self.step} (left)"), backend.table(f"{self.step} (right)"))
        self._settles = tuple(map(settle_of, self.sides))

    def _reset(self) -> None:
        for buffers in self.sides:
            buffers.clear()
        self._expiry: list[tuple[int, int, int, Any]] = []  # (drop at, tie-breaker, side, key)
        self._order = itertools.count()
        self.watermark = WATERMARK_MIN
        self.late_records = 0
        self.held = 0  # records in the buffers

    def _kept_until(self, side: int, timestamp: int) -> int:
        """The watermark at which a record of ``side`` at ``timestamp`` can match no more."""
        return timestamp + self.upper if side == LEFT else timestamp - self.lower

    def process(self, records):
        out, watermark, lower, upper = [], self.watermark, self.lower, self.upper
        for (side, value), timestamp, key in records:
            if timestamp <= watermark:
                self.late_records += 1
                continue
            other = self.sides[1 - side].get(key)
            if other is not None:
                if side == LEFT:
                    for t, right in other.between(timestamp + lower, timestamp + upper):
                        out.append(new_record(Record, (_pair(Joined, (value, right)), max(t, timestamp), key)))
                else:
                    for t, left in other.between(timestamp - upper, timestamp - lower):
                        out.append(new_record(Record, (_pair(Joined, (left, value)), max(t, timestamp), key)))
            until = self._kept_until(side, timestamp)
            if until > watermark:
                self._keep(side, key, timestamp, value, until)
        self._settle()
        return out

    def _settle(self) -> None:
        for settle in self._settles:
            settle()

    def _keep(self, side: int, key, timestamp: int, value, until: int) -> None:
        own = self.sides[side]
        buffer = own.get(key)
        if buffer is None:
            buffer = own[key] = _Buffer()
        buffer.insert(timestamp, value)
        self.changes.changed.add((side, key))
        self.held += 1
        heappush(self._expiry, (until, next(self._order), side, key))

    def on_watermark(self, watermark):
        self.watermark = watermark
        expiry = self._expiry
        while expiry and expiry[0][0] <= watermark:
            _, _, side, key = heappop(expiry)
            buffer = self.sides[side].get(key)
            if buffer is None:
                continue
            # Every record whose own limit the watermark reached goes, not just this one.
            self.held -= buffer.drop_until(watermark - self.upper if side == LEFT else watermark + self.lower)
            self.changes.changed.add((side, key))
            if not buffer.times:
                del self.sides[side][key]
        self._settle()
        self.changes.bound(self._identities_held())
        return []

    def _identities_held(self) -> int:
        return len(self.sides[0]) + len(self.sides[1])

    def _rest(self) -> dict:
        return {"watermark": self.watermark, "late": self.late_records}

    def _groups(self) -> dict[int, list]:
        groups: dict[int, list] = {}
        for side, buffers in enumerate(self.sides):
            for key, buffer in buffers.items():
                groups.setdefault(key_group(key), []).append((side, key, list(buffer.times), list(buffer.values)))
        return groups

    def _entry(self, identity: tuple) -> tuple | None:
        side, key = identity
        buffer = self.sides[side].get(key)
        return None if buffer is None else (side, key, list(buffer.times), list(buffer.values))

    def restore(self, state) -> None:
        self._reset()
        self.changes.reset()
        self._share.restored(state, state["groups"], self.changes)
        self.watermark, self.late_records = state["watermark"], state["late"]
        for group in sorted(state["groups"]):
            for side, key, times, values in state["groups"][group]:
                self.sides[side][key] = _Buffer(list(times), list(values))
                self.held += len(times)
                for timestamp in times:
                    heappush(self._expiry, (self._kept_until(side, timestamp), next(self._order), side, key))
            self._settle()

    def rescale(self, states, index, parallelism):
        return _rescaled(states, index, parallelism)

    def state_size(self) -> tuple[int, int]:
        """(records held, their estimated bytes; on disk, as the tables measure themselves)."""
        def values():
            return (v for buffers in self.sides for b in buffers.values() for v in b.values)
        return self.held, held_bytes(self.sides, values, self.held)


class TableJoinOp(_IncrementalJoin):
    """A stream–table join: side 0 is the stream, side 1 the table's changelog (upserts
    by key; a value of None deletes). A table value not written for ``ttl_ms`` of event
    time is forgotten once the watermark passes it.

    ``as_of="latest"``: a record takes the value current when it is processed.
    ``as_of="event_time"``: a record waits until the watermark reaches its timestamp and
    takes the version valid then; a table key keeps its versions from the newest one
    the watermark passed, the older ones can match nothing that may still arrive.
    """

    def __init__(self, step: str, as_of: str, ttl_ms: int | None, how: str,
                 table_value: Callable[[Any], Any] | None):
        super().__init__(step)
        self.as_of, self.ttl_ms, self.how, self.table_value = as_of, ttl_ms, how, table_value
        #: key -> its values by the time they were written (a table of the task's state
        #: backend once open)
        self.versions: MutableMapping[Any, _Buffer] = {}
        self._settle = settle_of(self.versions)
        self._reset()

    def open(self, task) -> None:
        """Hold the table's versions in the task's state backend (records waiting for
        theirs, and the times keys are pruned at, stay in memory)."""
        self.versions = task.state_backend.table(self.step)
        self._settle = settle_of(self.versions)

    def _reset(self) -> None:
        self.versions.clear()
        self.waiting: list[tuple[int, int, Any, Any]] = []  # event_time: (timestamp, tie-breaker, key, value)
        self._prune_at: list[tuple[int, int, Any]] = []  # (watermark, tie-breaker, key): prune the key then
        self._order = itertools.count()
        self.watermark = WATERMARK_MIN
        self.late_records = 0
        self.held = 0  # versions in the table

    def process(self, records):
        out, latest = [], self.as_of == "latest"
        for (side, value), timestamp, key in records:
            if side == RIGHT:
                self._upsert(key, timestamp, value)
            elif latest:
                self._emit(out, key, value, timestamp, self._current(key))
            elif timestamp <= self.watermark:
                self.late_records += 1
            else:
                heappush(self.waiting, (timestamp, next(self._order), key, value))
        self._settle()
        return out

    def _upsert(self, key, timestamp: int, record) -> None:
        fn = self.table_value
        try:
            value = record if fn is None else fn(record)
        except Exception as exc:
            raise StepError(self.step, record, exc) from exc
        versions = self.versions.get(key)
        if self.as_of == "latest" and versions is not None:  # latest: only the current value
            self._forget(key, len(versions.times))
            versions = None
        if self.as_of == "latest" and value is None:
            return
        if versions is None:
            versions = self.versions[key] = _Buffer()
        versions.insert(timestamp, value)
        self.held += 1
        self.changes.changed.add((key,))
        self._schedule(key, timestamp)
        self._prune(key)

    def _schedule(self, key, timestamp: int) -> None:
        """Prune ``key`` when the watermark passes the version written at ``timestamp``
        (it replaces older ones) and when that version's TTL runs out."""
        if self.as_of == "event_time":
            heappush(self._prune_at, (timestamp, next(self._order), key))
        if self.ttl_ms is not None:
            heappush(self._prune_at, (timestamp + self.ttl_ms - 1, next(self._order), key))

    def _current(self, key):
        versions = self.versions.get(key)
        return versions.values[-1] if versions is not None else None

    def _valid_at(self, key, timestamp: int):
        """The version of ``key`` in force at ``timestamp`` (None: none, or deleted)."""
        versions = self.versions.get(key)
        if versions is None:
            return None
        i = bisect_right(versions.times, timestamp) - 1
        if i < 0 or (self.ttl_ms is not None and timestamp >= versions.times[i] + self.ttl_ms):
            return None
        return versions.values[i]

    def _emit(self, out: list, key, value, timestamp: int, found) -> None:
        if found is not None or self.how == "left":
            out.append(new_record(Record, (_pair(Joined, (value, found)), timestamp, key)))

    def _prune(self, key) -> None:
        """Drop versions no record that may still arrive can take: all but the newest the
        watermark passed (and that one too when deleted or past its TTL)."""
        versions = self.versions[key]
        watermark, times = self.watermark, versions.times
        passed = bisect_right(times, watermark)
        gone = max(passed - 1, 0)
        if passed and (versions.values[passed - 1] is None
                       or (self.ttl_ms is not None and times[passed - 1] + self.ttl_ms <= watermark + 1)):
            gone = passed
        if gone:
            self._forget(key, gone)

    def _forget(self, key, count: int) -> None:
        """Drop the ``count`` oldest versions of ``key``."""
        versions = self.versions[key]
        del versions.times[:count]
        del versions.values[:count]
        self.held -= count
        self.changes.changed.add((key,))
        if not versions.times:
            del self.versions[key]

    def on_watermark(self, watermark):
        self.watermark = watermark
        out, waiting = [], self.waiting
        touched = set()
        while waiting and waiting[0][0] <= watermark:
            timestamp, _, key, value = heappop(waiting)
            self._emit(out, key, value, timestamp, self._valid_at(key, timestamp))
            touched.add(key)
        prune_at = self._prune_at
        while prune_at and prune_at[0][0] <= watermark:
            touched.add(heappop(prune_at)[2])
        for key in touched:
            if key in self.versions:
                self._prune(key)
        self._settle()
        self.changes.bound(len(self.versions))
        return out

    def _identities_held(self) -> int:
        return len(self.versions)

    def _rest(self) -> dict:
        """With the stream records waiting for their version, whole (the watermark bounds them)."""
        waiting = [(timestamp, key, value) for timestamp, _, key, value in sorted(self.waiting, key=itemgetter(0, 1))]
        return {"watermark": self.watermark, "late": self.late_records, "waiting": waiting}

    def _groups(self) -> dict[int, list]:
        groups: dict[int, list] = {}
        for key, versions in self.versions.items():
            groups.setdefault(key_group(key), []).append((key, list(versions.times), list(versions.values)))
        return groups

    def _entry(self, identity: tuple) -> tuple | None:
        versions = self.versions.get(identity[0])
        return None if versions is None else (identity[0], list(versions.times), list(versions.values))

    def restore(self, state) -> None:
        self._reset()
        self.changes.reset()
        self._share.restored(state, state["groups"], self.changes)
        self.watermark, self.late_records = state["watermark"], state["late"]
        for group in sorted(state["groups"]):
            for key, times, values in state["groups"][group]:
                self.versions[key] = _Buffer(list(times), list(values))
                self.held += len(times)
                for timestamp in times:
                    self._schedule(key, timestamp)
            self._settle()
        for timestamp, key, value in state["waiting"]:
            heappush(self.waiting, (timestamp, next(self._order), key, value))

    def rescale(self, states, index, parallelism):
        """Versions by key group; records waiting for their version go with their key."""
        groups = owned_groups(index, parallelism)
        return {**_rescaled(states, index, parallelism),
                "waiting": sorted((waiting for state in states if state is not None for waiting in state["waiting"]
                                   if key_group(waiting[1]) in groups), key=itemgetter(0))}

    def state_size(self) -> tuple[int, int]:
        """(versions and waiting records, their estimated bytes)."""
        versions = held_bytes([self.versions], lambda: (v for b in self.versions.values() for v in b.values),
                              self.held)
        return self.held + len(self.waiting), \
            versions + estimated_bytes((w[3] for w in self.waiting), len(self.waiting))


def _rescaled(states: list[dict], index: int, parallelism: int) -> dict:
    """A join's buffers of the key groups task ``index`` of ``parallelism`` owns, and the
    count of late records of the old tasks it inherits from (:func:`inherited`)."""
    return {**keyed_share(states, index, parallelism),
            "late": sum(state["late"] for state in inherited(states, index, parallelism))}
