"""The window operator: keyed windowed aggregation driven by records and watermarks, over
the assigners and triggers of :mod:`gearbus.api.windows` (time follows Flink; see there).

Pure computation (no I/O, no asyncio), so that the TestRunner and the distributed
executors run the same code and emit the same panes.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from functools import lru_cache, partial
from heapq import heappop, heappush
from math import inf
from operator import itemgetter
from typing import Any

from gearbus.api.aggregators import Aggregator
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.api.windows import (
    EARLY,
    LATE,
    ON_TIME,
    Accumulation,
    CountTrigger,
    RepeatTrigger,
    Trigger,
    WatermarkTrigger,
    Window,
    WindowAssigner,
    WindowResult,
    checked_millis,
)
from gearbus.api.partitioners import key_group, owned_groups
from gearbus.runtime.keygroups import ChangeLog, Groups, detached, estimated_bytes, inherited, keyed_share
from gearbus.runtime.state_backend import Keys, decode_key, encode_key, exact_key, nothing

#: ``_tuple(Window, (start, end))`` builds a NamedTuple at C speed (see task.new_record).
_tuple = tuple.__new__
_START = itemgetter(0)
_END = itemgetter(1)
_NO_PANE = object()


def _early_count(trigger: Trigger | None) -> int | None:
    if trigger is None or isinstance(trigger, WatermarkTrigger):
        return None
    if isinstance(trigger, RepeatTrigger) and isinstance(trigger.trigger, CountTrigger):
        return trigger.trigger.count
    raise ValueError(
        f"unsupported trigger {trigger!r}: use Triggers.watermark() (the default) or "
        "Triggers.repeat(Triggers.count(n)) for early panes"
    )


class _Pane:
    """State of one (key, window): its accumulator, and the weight of the records that
    arrived since it last fired (for the count trigger)."""

    __slots__ = ("acc", "count")

    def __init__(self, acc: Any):
        self.acc = acc
        self.count = 0


def _stored_pane(acc, count: int) -> _Pane:
    pane = _Pane(acc)
    pane.count = count
    return pane


#: A window bound as stored: 16 bytes, biased to sort as unsigned (a bound may pass the
#: 64-bit range: a window of a record near the largest watermark ends past it).
_BOUND_BYTES = 16
_BIAS = 2**127


@lru_cache(maxsize=4096)
def _bounds(window) -> bytes:
    """A window's bounds as stored: its end, then its start (a window's panes are one
    range, in the order windows complete)."""
    try:
        return (window[1] + _BIAS).to_bytes(_BOUND_BYTES, "big") + (window[0] + _BIAS).to_bytes(_BOUND_BYTES, "big")
    except (OverflowError, TypeError) as exc:
        raise ValueError(f"window {window!r}: the rocksdb state backend stores window bounds that are whole "
                         f"numbers within ±2**127") from exc


class PaneKeys(Keys):
    """How a disk table stores panes, keyed ``(window, key)``: by window end, start, then
    key, so that a window's panes are one range (fired, then removed, together)."""

    prefix = staticmethod(_bounds)

    @staticmethod
    def encode(pane_key) -> bytes:
        return _bounds(pane_key[0]) + encode_key(pane_key[1])

    @staticmethod
    def decode(encoded: bytes) -> tuple:
        end = int.from_bytes(encoded[:_BOUND_BYTES], "big") - _BIAS
        start = int.from_bytes(encoded[_BOUND_BYTES:2 * _BOUND_BYTES], "big") - _BIAS
        return _tuple(Window, (start, end)), decode_key(encoded[2 * _BOUND_BYTES:])

    @staticmethod
    def exact(pane_key) -> bool:
        return exact_key(pane_key[1])

    @staticmethod
    def pack(pane: _Pane) -> tuple:
        return pane.acc, pane.count

    @staticmethod
    def unpack(stored: tuple) -> _Pane:
        return _stored_pane(*stored)

    span = (b"", b"\xff" * (2 * _BOUND_BYTES + 2))


class _DiskPanes:
    """One window's panes in the step's disk table: the dict operations the operator uses
    on a non-merging window, plus reads that keep nothing (``peek``, ``peek_items``)."""

    __slots__ = ("table", "window", "count")

    def __init__(self, table, window: Window):
        self.table = table
        self.window = window
        self.count = 0

    def get(self, key, default=None):
        return self.table.get((self.window, key), default)

    def peek(self, key, default=None):
        return self.table.peek((self.window, key), default)

    def __setitem__(self, key, pane: _Pane) -> None:
        """A pane for a key the window does not hold (the operator asks first)."""
        self.table[(self.window, key)] = pane
        self.count += 1

    def __len__(self) -> int:
        return self.count

    def items(self):
        """Every pane, kept waiting in memory: the caller fires it, changing it in place."""
        return ((key, pane) for (_, key), pane in self.table.scope_items(self.window, keep=True))

    def peek_items(self):
        return ((key, pane) for (_, key), pane in self.table.scope_items(self.window, keep=False))

    def __iter__(self):
        return (key for key, _ in self.peek_items())

    def clear(self) -> None:
        self.table.remove_scope(self.window)
        self.count = 0


def _new_dict(window: Window) -> dict:
    return {}


def window_limits(watermark: int, allowed_lateness_ms: int) -> tuple[float, float]:
    """The lateness rule: under ``watermark``, a window with end <= the first limit is
    complete (a record for it fires a LATE pane), and one with end <= the second is past
    its allowed lateness (a record for it is dropped as late)."""
    if watermark >= WATERMARK_MAX:
        return inf, inf
    fire_limit = watermark + 1
    return fire_limit, fire_limit - allowed_lateness_ms


class WindowOperator:
    """Keyed windowed aggregation driven by records and watermarks.

    Panes come back from :meth:`process`, :meth:`process_partial` and :meth:`advance` as
    lists of :class:`WindowResult`, in a deterministic order for a given input sequence.
    """

    def __init__(
        self,
        assigner: WindowAssigner,
        aggregator: Aggregator,
        trigger: Trigger | None = None,
        accumulation: Accumulation = Accumulation.DISCARDING,
        allowed_lateness_ms: int = 0,
        side_output_late: bool = False,
    ):
        if not isinstance(assigner, WindowAssigner):
            raise TypeError(f"assigner must be a WindowAssigner (TumblingWindows, ...), got {assigner!r}")
        if not isinstance(aggregator, Aggregator):
            raise TypeError(f"aggregator must be an Aggregator (Count, AggregateFunction, ...), got {aggregator!r}")
        if not isinstance(accumulation, Accumulation):
            raise TypeError(f"accumulation must be an Accumulation, got {accumulation!r}")
        self._combinable = aggregator.combinable
        if assigner.merging and not self._combinable:
            raise ValueError(
                f"{assigner!r} merges windows, which needs an aggregator with merge; "
                f"{aggregator!r} is not combinable (a Fold cannot merge: use Reduce, or an "
                "AggregateFunction with merge)"
            )
        self.assigner = assigner
        self.aggregator = aggregator
        self.accumulation = accumulation
        self.allowed_lateness_ms = checked_millis("allowed_lateness_ms", allowed_lateness_ms, 0)
        self.side_output_late = bool(side_output_late)
        self._early_count = _early_count(trigger)
        self._discarding = accumulation is Accumulation.DISCARDING
        self._merging = assigner.merging
        self._assign = assigner.assign
        self._create = aggregator.create
        self._add = aggregator.add
        self._merge = aggregator.merge
        self._result = aggregator.result

        self._set_watermark(WATERMARK_MIN)
        #: window -> key -> pane; keys in the order the window first saw them (in memory;
        #: on disk, those waiting first, then by key group: see :meth:`hold_in`).
        self._windows: dict[Window, dict[Any, _Pane]] = {}
        self._table = None  # the disk table holding the panes, if any
        self._new_panes, self._peek, self._peek_items = _new_dict, dict.get, dict.items
        self._forget = self.settle = nothing
        #: Sessions only: key -> its windows, sorted and disjoint.
        self._sessions: dict[Any, list[Window]] = {}
        #: Heaps of (end, start): windows waiting to complete, and complete windows
        #: waiting to expire. Sessions leave stale entries behind when they merge.
        self._pending: list[tuple[int, int]] = []
        self._expiring: list[tuple[int, int]] = []
        self._late: list[tuple[Any, Any, int]] = []
        #: The (window, key) of every pane changed since the last snapshot: what an
        #: incremental snapshot holds (see :meth:`changes_since`).
        self.changes = ChangeLog()
        self._changed = self.changes.changed
        self._bound_at = ChangeLog.SLACK  # changes past which advance() checks the bound
        #: Weight of the records dropped because all their windows had expired.
        self.late_dropped = 0
        #: Records kept for the side output instead (side_output_late=True).
        self.late_side_output = 0

    @property
    def watermark(self) -> int:
        """The input watermark: the largest one seen."""
        return self._watermark

    @property
    def state_size(self) -> int:
        """The number of live (key, window) states."""
        return sum(map(len, self._windows.values()))

    @property
    def state_bytes(self) -> int:
        """The live states' size, estimated from a sample (see keygroups.estimated_bytes),
        or as the disk table measures itself (reading nothing into memory)."""
        if self._table is not None:
            return self._table.size()[1] if self._windows else 0
        panes = ((window, key, pane.acc) for window, panes in self._windows.items() for key, pane in panes.items())
        return estimated_bytes(panes, self.state_size)

    def hold_in(self, backend, step: str) -> None:
        """Keep the panes in ``backend``'s table for ``step`` (a call before any record). On
        disk, a window's panes fire with those waiting in memory first, then by key group
        and key; ``settle`` between batches writes them out. Session windows stay in
        memory: they merge per key, through an index of each key's sessions held in
        memory anyway."""
        if self._merging:
            return
        table = backend.table(step, PaneKeys)
        if isinstance(table, dict):
            return
        self._table, self._new_panes = table, partial(_DiskPanes, table)
        self._peek, self._peek_items, self._forget = _DiskPanes.peek, _DiskPanes.peek_items, _DiskPanes.clear
        self.settle = table.settle

    @property
    def on_disk(self) -> bool:
        """Whether the panes are held in a disk table (see :meth:`hold_in`)."""
        return self._table is not None

    def prefetch(self, keyed_times) -> None:
        """On disk: read the panes of a batch's ``(key, timestamp)`` in one multi-get."""
        assign = self._assign
        self._table.prefetch([(window, key) for key, timestamp in keyed_times for window in assign(timestamp)])

    def process(self, key: Any, value: Any, timestamp: int, watermark: int) -> list[WindowResult]:
        """Add one record; ``watermark`` is the input watermark when it arrived.

        Returns EARLY panes fired by the count trigger and LATE panes of late records. A
        watermark ahead of the operator's is applied first, as :meth:`advance` would, so
        ON_TIME panes may come first.
        """
        out = self.advance(watermark) if watermark > self._watermark else []
        if self._merging:
            added = self._add_to_session(key, self._add, value, 1, timestamp, out)
        else:
            added = False
            for window in self._assign(timestamp):
                added |= self._add_to_window(key, window, self._add, value, 1, out)
        if not added:
            # Like Flink, a record counts as late only when every one of its windows had
            # expired; a sliding record still kept by some window is not dropped.
            if self.side_output_late:
                self._late.append((key, value, timestamp))
                self.late_side_output += 1
            else:
                self.late_dropped += 1
        return out

    def process_partial(
        self, key: Any, accumulator: Any, weight: int, timestamp: int, watermark: int
    ) -> list[WindowResult]:
        """Add a pre-aggregated accumulator standing for ``weight`` records (map-side
        combine), merged in with the aggregator's merge.

        Exact when every record of the partial has the same windows as ``timestamp``
        (the same tumbling window; for sliding windows, the same gcd(size, slide) slice)
        and arrived behind the same watermark. The weight counts toward count triggers
        and ``late_dropped``; one partial fires at most one EARLY or LATE pane.
        """
        if self._merging:
            raise ValueError(
                "process_partial cannot be used with SessionWindows: which sessions a partial's "
                "records belong to depends on their own timestamps; send the records instead"
            )
        if not self._combinable:
            raise ValueError(f"process_partial needs a combinable aggregator; {self.aggregator!r} has no merge")
        if self.side_output_late:
            raise ValueError(
                "process_partial cannot be used with side_output_late: the side output needs the "
                "late records themselves; do not combine before this operator"
            )
        out = self.advance(watermark) if watermark > self._watermark else []
        added = False
        for window in self._assign(timestamp):
            added |= self._add_to_window(key, window, self._merge, accumulator, weight, out)
        if not added:
            self.late_dropped += weight
        return out

    def advance(self, watermark: int) -> list[WindowResult]:
        """Move the input watermark forward (a smaller one is ignored).

        Fires the ON_TIME pane of every (key, window) that completes, ordered by window
        end, window start, then key in the order the window first saw it; then forgets
        windows past their allowed lateness.
        """
        if watermark <= self._watermark:
            return []
        fire_limit, expire_limit = self._set_watermark(watermark)
        out: list[WindowResult] = []
        fire = self._fire
        pending = self._pending
        while pending and pending[0][0] <= fire_limit:
            entry = heappop(pending)
            while pending and pending[0] == entry:
                heappop(pending)
            end, start = entry
            window = _tuple(Window, (start, end))
            panes = self._windows.get(window)
            if not panes:
                continue  # a session that merged into a larger one
            if end <= expire_limit:  # fired, then gone: on disk, nothing read is kept to fire
                for key, pane in self._peek_items(panes):
                    out.append(fire(key, window, pane, ON_TIME))
                self._drop_window(window, fired=True)
            else:
                for key, pane in panes.items():
                    out.append(fire(key, window, pane, ON_TIME))
                heappush(self._expiring, entry)
        expiring = self._expiring
        while expiring and expiring[0][0] <= expire_limit:
            end, start = heappop(expiring)
            self._drop_window(_tuple(Window, (start, end)))
        if len(self._changed) > self._bound_at:  # counting the panes costs a pass over the windows
            held = self.state_size
            self.changes.bound(held)
            self._bound_at = 2 * held + ChangeLog.SLACK
        return out

    def drain_late(self) -> list[tuple[Any, Any, int]]:
        """Return and forget the (key, value, timestamp) of late records kept for the side
        output (always empty unless side_output_late)."""
        late, self._late = self._late, []
        return late

    def panes_of(self, key) -> list[tuple[int, int, Any]]:
        """The key's open windows, by start: (start, end, the aggregate's result so far)."""
        peek, found = self._peek, []
        for (start, end), panes in self._windows.items():
            pane = peek(panes, key, _NO_PANE)
            if pane is not _NO_PANE:
                found.append((start, end, self._result(pane.acc)))
        return sorted(found)

    def snapshot(self, step: str = "window") -> dict:
        """The operator's state at a checkpoint barrier (of step ``step``, which an
        accumulator that cannot be copied is reported by), as plain picklable data::

            {"watermark": int, "late_dropped": int, "late_side_output": int,
             "late": [(key, value, timestamp), ...],   # not yet drained
             "groups": {key_group: [(window_start, window_end, key, acc, count), ...]}}

        Panes are grouped by :func:`~gearbus.runtime.keygroups.key_group`, so that a
        task can be given the groups of several snapshots. Mutable accumulators are
        copied: the state stays valid while the operator goes on (an aggregator may
        update its accumulators in place).
        """
        groups: dict[int, list[tuple]] = {}
        for (start, end), panes in self._windows.items():
            for key, pane in self._peek_items(panes):
                groups.setdefault(key_group(key), []).append((start, end, key, detached(pane.acc, step, key),
                                                              pane.count))
        return {**self.snapshot_rest(), "groups": Groups(groups)}

    def snapshot_rest(self) -> dict:
        """:meth:`snapshot` without the panes: what an incremental snapshot holds whole."""
        return {
            "watermark": self._watermark,
            "late_dropped": self.late_dropped,
            "late_side_output": self.late_side_output,
            "late": list(self._late),
        }

    def changes_since(self, step: str, checkpoint_id: int | None,
                      base: int | None) -> tuple[dict[int, list], dict[int, list]] | None:
        """The panes changed since the snapshot of checkpoint ``base``, for the snapshot of
        ``checkpoint_id``: (written ``(start, end, key, acc, count)``, removed ``(start,
        end, key)``) by key group; None when this snapshot must be whole (see ChangeLog)."""
        held = self.state_size
        self.changes.bound(held)  # abandoned checkpoints' changes count too
        changed = self.changes.take(checkpoint_id, base, held)
        if changed is None:
            return None
        written: dict[int, list[tuple]] = {}
        removed: dict[int, list[tuple]] = {}
        windows, peek = self._windows, self._peek
        for window, key in changed:
            panes = windows.get(window)
            pane = _NO_PANE if panes is None else peek(panes, key, _NO_PANE)
            if pane is _NO_PANE:
                removed.setdefault(key_group(key), []).append((window[0], window[1], key))
            else:
                written.setdefault(key_group(key), []).append(
                    (window[0], window[1], key, detached(pane.acc, step, key), pane.count))
        return written, removed

    def restore(self, state: dict) -> None:
        """Replace the operator's state with a :meth:`snapshot`'s, whose ``groups`` may
        be the union of several snapshots' (taken at the same barrier).

        Fed the rest of the input, the restored operator fires the same panes at the
        same calls as the one snapshotted; only the keys of one window that complete
        together come out ordered by key group first (then by first arrival), as the
        order across groups is not kept.
        """
        self._set_watermark(state["watermark"])
        self.late_dropped = state["late_dropped"]
        self.late_side_output = state["late_side_output"]
        self._late = list(state["late"])
        self._windows, self._sessions, self._pending, self._expiring = {}, {}, [], []
        if self._table is not None:
            self._table.clear()
        self.changes.reset()
        groups = state["groups"]
        for group in sorted(groups):
            for start, end, key, acc, count in groups[group]:
                window = _tuple(Window, (start, end))
                self._panes(window)[key] = _stored_pane(acc, count)
                if self._merging:
                    self._sessions.setdefault(key, []).append(window)
            self.settle()
        for sessions in self._sessions.values():
            sessions.sort()

    @staticmethod
    def rescale(states: list[dict], index: int, parallelism: int) -> dict:
        """Task ``index`` of ``parallelism``'s share of several tasks' snapshots (None: an
        old task it does not read): the panes and late records of its key groups, and the
        counts of the old tasks it inherits from (:func:`inherited`)."""
        groups, heirloom = owned_groups(index, parallelism), inherited(states, index, parallelism)
        return {
            **keyed_share(states, index, parallelism),
            "late_dropped": sum(state["late_dropped"] for state in heirloom),
            "late_side_output": sum(state["late_side_output"] for state in heirloom),
            "late": [late for state in states if state is not None for late in state["late"]
                     if key_group(late[0]) in groups],
        }

    # --- internals -------------------------------------------------------------------

    def _set_watermark(self, watermark: int) -> tuple[float, float]:
        """Take ``watermark`` and derive the limits from it; return them.

        Windows with end <= _fire_limit are complete; with end <= _expire_limit, past
        their allowed lateness. Kept as limits so each record costs one comparison.
        """
        self._watermark = watermark
        self._fire_limit, self._expire_limit = window_limits(watermark, self.allowed_lateness_ms)
        return self._fire_limit, self._expire_limit

    def _add_to_window(self, key, window: Window, fold, item, weight: int, out: list) -> bool:
        """Fold ``item`` into (key, window); False when the window has expired."""
        panes = self._windows.get(window)
        if panes is None:
            if window[1] <= self._expire_limit:
                return False
            panes = self._new_window(window)
        pane = panes.get(key)
        if pane is None:
            pane = panes[key] = _Pane(self._create())
        self._update(key, window, pane, fold, item, weight, out)
        return True

    def _add_to_session(self, key, fold, item, weight: int, timestamp: int, out: list) -> bool:
        """Fold ``item`` into the session of ``key`` around ``timestamp``, merging the
        sessions it overlaps or touches; False when it is alone and expired."""
        start, end = timestamp, timestamp + self.assigner.gap_ms
        sessions = self._sessions.get(key)
        if sessions is None:
            if end <= self._expire_limit:
                return False
            sessions = self._sessions[key] = []
        # Sessions are disjoint and sorted, so the ones this record touches are a run.
        lo = bisect_left(sessions, start, key=_END)
        hi = bisect_right(sessions, end, lo, key=_START)
        if lo == hi:
            # A lone session judges its own lateness; one that merges is at least as
            # recent as the live sessions it joins, so it is never expired.
            if end <= self._expire_limit:
                return False
            window = _tuple(Window, (start, end))
            sessions.insert(lo, window)
            pane = _Pane(self._create())
            self._panes(window)[key] = pane
        else:
            first = sessions[lo]
            window = _tuple(Window, (min(start, first[0]), max(end, sessions[hi - 1][1])))
            if window == first:
                pane = self._windows[window][key]
            else:
                pane = self._take(key, first)
                for old in sessions[lo + 1 : hi]:
                    other = self._take(key, old)
                    pane.acc = self._merge(pane.acc, other.acc)
                    pane.count += other.count
                sessions[lo:hi] = [window]
                self._panes(window)[key] = pane
        self._update(key, window, pane, fold, item, weight, out)
        return True

    def _update(self, key, window: Window, pane: _Pane, fold, item, weight: int, out: list) -> None:
        self._changed.add((window, key))
        pane.acc = fold(pane.acc, item)
        if window[1] <= self._fire_limit:
            out.append(self._fire(key, window, pane, LATE))
        elif self._early_count is not None:
            pane.count += weight
            if pane.count >= self._early_count:
                out.append(self._fire(key, window, pane, EARLY))

    def _fire(self, key, window: Window, pane: _Pane, timing: str) -> WindowResult:
        self._changed.add((window, key))
        value = self._result(pane.acc)
        if self._discarding:
            pane.acc = self._create()
        pane.count = 0
        return _tuple(WindowResult, (key, value, window[0], window[1], timing))

    def _panes(self, window: Window) -> dict[Any, _Pane]:
        """The panes of ``window``, which is not expired; a new window is scheduled."""
        panes = self._windows.get(window)
        if panes is None:
            panes = self._new_window(window)
        return panes

    def _new_window(self, window: Window) -> dict[Any, _Pane]:
        panes = self._windows[window] = self._new_panes(window)
        start, end = window
        heappush(self._expiring if end <= self._fire_limit else self._pending, (end, start))
        return panes

    def _take(self, key, window: Window) -> _Pane:
        """Remove and return the pane of a session that is merging into another."""
        panes = self._windows[window]
        pane = panes.pop(key)
        self._changed.add((window, key))
        if not panes:
            del self._windows[window]
        return pane

    def _drop_window(self, window: Window, fired: bool = False) -> None:
        """Forget a window; ``fired``: all its panes fired just now (so are marked changed)."""
        panes = self._windows.pop(window, None)
        if panes:
            if not fired:
                self._changed.update(dict.fromkeys((window, key) for key in panes))
            self._forget(panes)
        if panes and self._merging:
            for key in panes:
                sessions = self._sessions[key]
                del sessions[bisect_left(sessions, window)]
                if not sessions:
                    del self._sessions[key]
