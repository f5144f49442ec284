"""Key groups: the unit in which keyed state is snapshotted and redistributed (as in
Flink). Every key belongs to one of MAX_PARALLELISM groups, whatever the parallelism,
so a checkpoint taken with N tasks can be restored with M by handing out whole groups.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import itertools
import pickle
import sys
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from operator import is_, is_not, itemgetter
from typing import Any

from gearbus.api.partitioners import MAX_PARALLELISM, key_group, owned_groups


#: Types a snapshot can share with live state instead of copying it.
IMMUTABLE_TYPES = frozenset({int, float, bool, str, bytes, type(None)})
#: Entries pickled to estimate a step's state bytes (cost bounded, whatever its size).
SIZE_SAMPLE = 32


class UnserialisableState(TypeError):
    """A step holds a value that a checkpoint can neither copy nor serialise."""


def detached(value: Any, step: str, key: Any) -> Any:
    """``value`` itself when it cannot change, else a deep copy: a snapshot stays valid
    while the step goes on (user code may update its state in place). A value that cannot
    be copied fails the step, naming it, the key and the value's type."""
    if type(value) in IMMUTABLE_TYPES:
        return value
    try:
        return copy.deepcopy(value)
    except Exception as exc:
        raise UnserialisableState(f"step {step!r} holds a {type(value).__name__} for key {key!r}, which a "
                                  f"checkpoint cannot copy: {type(exc).__name__}: {exc}") from exc


def unserialisable_part(state: Any) -> str:
    """Where in a task's snapshot state (steps' states: dicts, Deltas, key groups of
    entries) is the first entry pickle refuses, and the type of its value that it refuses:
    what a declined checkpoint names. Empty when none is found."""
    def search(node, step):
        if isinstance(node, WindowDelta):
            node = {"written": node.written, **node.rest}
        elif isinstance(node, Delta):
            node = node.written
        if isinstance(node, Mapping):
            for name, value in node.items():
                found = search(value, name if step is None and isinstance(name, str) else step)
                if found:
                    return found
        elif isinstance(node, (list, tuple)):
            for item in node:
                if not _pickles(item):
                    if not isinstance(item, tuple):
                        return search(item, step) or f"step {step!r}: a {type(item).__name__}"
                    bad = next((v for v in item if not _pickles(v)), item)
                    return f"step {step!r}, entry {_short(item)}: a {type(bad).__name__}"
        return ""
    return search(state, None)


def _pickles(value: Any) -> bool:
    try:
        pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
    except Exception:
        return False
    return True


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def estimated_bytes(entries: Iterable[Any], count: int) -> int:
    """The pickled size of ``count`` entries, estimated from the first SIZE_SAMPLE of
    ``entries`` (an iterator over them): a metric cheap enough to take every second."""
    sample = list(itertools.islice(entries, SIZE_SAMPLE))
    if not sample:
        return 0
    try:
        size = len(pickle.dumps(sample, pickle.HIGHEST_PROTOCOL))
    except Exception:  # state pickle refuses (a checkpoint names it): its size in memory instead
        size = sum(map(sys.getsizeof, itertools.chain.from_iterable(
            entry if isinstance(entry, tuple) else (entry,) for entry in sample)))
    return size * count // len(sample)


_paused = 0  # collector pauses under way (collector_paused)
_pausing = threading.Lock()


@contextlib.contextmanager
def collector_paused():
    """The cyclic garbage collector off while a chain is added up (a restore, a
    compaction): it makes millions of short-lived tuples, which the collector traverses
    again at each generation it promotes them to; reference counting frees them all the
    same. A tenth of a restore's time and of a compaction's at 5,000,000 keys. Pauses in
    several threads at once share one: the collector runs again when the last ends."""
    global _paused
    with _pausing:
        _paused += 1
        gc.disable()
    try:
        yield
    finally:
        with _pausing:
            _paused -= 1
            if not _paused:
                gc.enable()


class Changes(dict):
    """The keys a step changed since its last snapshot, each with the state the step last
    wrote for it when it wrote one (a snapshot takes it as it is: no read of the key in a
    state of millions, whose cache misses were most of a checkpoint's cost on the task's
    path), else None: the snapshot reads the key (removed, changed in place, or another
    part of its entry changed). :meth:`add` marks a key changed, keeping a state written."""

    __slots__ = ()
    add = dict.setdefault  # a C call on every change, as set.add was


class ChangeLog:
    """The keys a keyed step changed (written, removed, or read as a value that can change
    in place), so a snapshot holds only what changed since the one it builds on.

    ``changed`` (:class:`Changes`) collects keys since the last snapshot; each snapshot
    keeps its own by checkpoint until its base moves past it (see
    :class:`gearbus.runtime.snapshots.Lineage`), so a snapshot building on checkpoint b
    holds every key changed since b's snapshot.

    What it remembers is bounded (:meth:`bound`): past a few times the keys held (many keys
    come and go, or no checkpoint completes, or checkpoints are off) it forgets, and the
    snapshots are whole until one taken after that becomes the base."""

    #: Changed keys remembered, beyond twice the keys held, before the log forgets them.
    SLACK = 1024

    def __init__(self):
        self.changed = Changes()
        self._taken: dict[int, Changes] = {}
        self._forgot = False  # since the last snapshot
        self._whole_before = 0  # snapshots building on an older base than this are whole
        #: the rescale's share the step restored from, which forgetting the changes since drops
        self.share: RescaleShare | None = None

    def take(self, checkpoint_id: int | None, base: int | None, held: int | None = None) -> Changes | None:
        """The keys to snapshot for ``checkpoint_id`` building on ``base``'s snapshot, with
        the states written (see :class:`Changes`; None: every key, a whole snapshot; also
        when at least ``held``, the keys held, changed since: a whole snapshot is then no
        larger, and cheaper to take)."""
        changed = Changes(self.changed)
        self.changed.clear()
        if checkpoint_id is not None:
            self._taken[checkpoint_id] = changed
            if self._forgot:
                self._forgot, self._whole_before = False, checkpoint_id
        if base is None or base < self._whole_before or self._forgot:
            return None
        for old in [c for c in self._taken if c <= base]:
            del self._taken[old]
        since = changed
        if older := [self._taken[c] for c in sorted(self._taken) if c != checkpoint_id]:
            since = Changes()
            for taken in [*older, changed]:  # in order: a later change's state wins
                since.update(taken)
        return None if held is not None and len(since) >= held else since

    def bound(self, held: int) -> None:
        """Forget the changes once they outnumber twice the ``held`` keys (plus SLACK)."""
        if len(self.changed) + sum(map(len, self._taken.values())) > 2 * held + self.SLACK:
            self.changed.clear()
            self._taken.clear()
            self._forgot = True
            if self.share is not None:
                self.share.state = None  # no snapshot can be built from it any more: its bytes go

    def reset(self) -> None:
        """The step was restored: nothing changed since."""
        self.changed.clear()
        self._taken.clear()
        self._forgot, self._whole_before = False, 0


def pickled_entries(entries: list) -> bytes:
    """A key group's entries pickled: as columns (a tuple of lists, one per field) when
    they are tuples of one length, as almost all are; else as they are. Pickle writes and
    reads a list of numbers or strings about twice as fast as the same values in tuples
    (5,000,000 keys: a restore and a compaction each read and write them all)."""
    if entries and set(map(type, entries)) == {tuple} and len(widths := set(map(len, entries))) == 1 \
            and 0 not in widths:
        return pickle.dumps(fields_of(entries), pickle.HIGHEST_PROTOCOL)
    return pickle.dumps(entries, pickle.HIGHEST_PROTOCOL)


def fields_of(entries: list[tuple]) -> tuple[list, ...]:
    """Entries (tuples of one length, at least one) as columns, one list per field."""
    return tuple(list(map(itemgetter(field), entries)) for field in range(len(entries[0])))


def group_fields(groups: Mapping[int, list], group: int) -> tuple[list, ...]:
    """Group ``group`` of ``groups`` as columns, one list per field (none: it holds no
    entries, or none there); a stored group's read as pickled, without building its
    entries."""
    if isinstance(groups, LazyGroups):
        return groups.fields(group)
    entries = groups.get(group)
    return fields_of(entries) if entries else ()


def merged_by_key(whole: tuple[list, ...], layers: list[tuple[Iterable, tuple[list, ...]]]) -> tuple[list, ...]:
    """Entries told by their first field (the key), as columns (:func:`fields_of`):
    ``whole``'s with each layer (the keys removed, then the columns written) applied in
    order. A key written again keeps its place, a new one goes last, as in a dict of the
    entries by key. Worked out a column at a time, in dicts built and updated from whole
    columns, without an entry or a Python call per key: a third of the cost of adding up
    entries by identity (as :class:`ChainedGroups` still does for windows and joins) at
    millions of keys. A column of Nones throughout (no TTL: no write times) is not
    gathered. A layer writes a key at most once (a snapshot's changes are by key)."""
    width = len(whole) or max((len(written) for _, written in layers), default=0)
    if not width:
        return ()
    whole = whole or ([],) * width
    keys = whole[0]
    values = {field: dict(zip(keys, whole[field])) for field in range(1, width)
              if not all(_nones(part) for part in [whole[field], *(written[field] for _, written in layers if written)])}
    order = next(iter(values.values())) if values else dict.fromkeys(keys)
    for removed, written in layers:
        for key in removed:
            order.pop(key, None)
            for by_key in values.values():
                by_key.pop(key, None)
        if written:
            if not values:
                order.update(dict.fromkeys(written[0]))
            for field, by_key in values.items():
                by_key.update(zip(written[0], written[field]))
    count = len(order)
    return (list(order), *(list(values[field].values()) if field in values else [None] * count
                           for field in range(1, width)))


def _nones(column: list) -> bool:
    """Whether every value of ``column`` is None (a field no entry uses)."""
    return not any(map(is_not, column, itertools.repeat(None)))


def any_none(values: Iterable) -> bool:
    """Whether any of ``values`` is None, told by identity: ``None in values`` calls each
    state's ==, which is the user's (a numpy array's answers with an array, and failed the
    checkpoint)."""
    return any(map(is_, values, itertools.repeat(None)))


def entries_from(data: bytes) -> list:
    """The entries :func:`pickled_entries` pickled."""
    loaded = pickle.loads(data)
    return list(zip(*loaded)) if type(loaded) is tuple else loaded


class Groups(dict):
    """A step's entries by key group, as a snapshot holds them: pickled one key group at a
    time, and read back one key group at a time (:class:`StoredGroups`).

    Pickle holds the interpreter lock for the whole of a call, and one call over a state of
    millions of keys stopped every thread of the process for seconds (its heartbeats too:
    an AppMaster compacting such a state was declared lost, and so were the executors
    whose heartbeats it could not answer). Between groups, other threads run."""

    __slots__ = ()

    def __reduce__(self):
        return _stored_groups, ([(group, pickled_entries(entries))
                                 for group, entries in self.items()],)

    def __copy__(self) -> Groups:
        return Groups(self)


class LazyGroups(Mapping):
    """Entries by key group worked out only when a group is read, and not kept: what a
    restore or a compaction adds up holds one key group's entries in memory at a time,
    beside the stored bytes. Pickled a group at a time, as :class:`Groups`. Two are equal
    when their groups that hold entries are. ``_groups``: a dict whose keys are the
    groups, in order."""

    __slots__ = ("_groups",)
    __hash__ = None  # type: ignore[assignment]

    def __iter__(self):
        return iter(self._groups)

    def __len__(self) -> int:
        return len(self._groups)

    def __contains__(self, group) -> bool:
        return group in self._groups

    def pickled(self, group: int) -> bytes | None:
        """The group's entries pickled (None: it holds none)."""
        entries = self[group]
        return pickled_entries(entries) if entries else None

    def fields(self, group: int) -> tuple[list, ...]:
        """The group's entries as columns, one list per field (none: it holds none)."""
        entries = self[group] if group in self._groups else ()
        return fields_of(entries) if entries else ()

    def __reduce__(self):
        return _stored_groups, ([(group, data) for group in self if (data := self.pickled(group)) is not None],)

    def __eq__(self, other):
        if not isinstance(other, Mapping):
            return NotImplemented
        return _holding(self) == _holding(other)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({_holding(self)!r})"


def _holding(groups: Mapping) -> dict[int, list]:
    return {group: list(entries) for group in groups if (entries := groups[group])}


class StoredGroups(LazyGroups):
    """Entries by key group as stored: each group unpickled when read."""

    __slots__ = ()

    def __init__(self, parts: dict[int, bytes]):
        self._groups = parts

    def __getitem__(self, group: int) -> list:
        return entries_from(self._groups[group])

    def fields(self, group: int) -> tuple[list, ...]:
        """The group's entries as columns, one list per field (read without building them)."""
        if group not in self._groups:
            return ()
        loaded = pickle.loads(self._groups[group])
        if not loaded:
            return ()
        return loaded if type(loaded) is tuple else fields_of(loaded)

    def pickled(self, group: int) -> bytes | None:
        return self._groups[group]


class Columns(LazyGroups):
    """A keyed step's entries ``(key, state, written)`` as columns, in the order taken,
    with each entry's key group beside it (``group_of``, one byte per entry; ``written``
    None: no TTL, every entry's None): what a snapshot takes of the keys changed since the
    last. Pickled as the flat columns (3 ms for 120,000 keys, against 26 ms as tuples by
    key group, and 20 ms more to build those tuples on the task's path). A restore into
    the task that took it applies the columns as they are (:meth:`columns`); read by key
    group (a compaction, off the task's path), every group's columns are split out in one
    pass in the order taken (a pass per group would touch the entries out of memory
    order, at seven times the cost) and kept, never worked out again where they are
    read."""

    __slots__ = ("_keys", "_states", "_written", "_group_of", "_by_group")

    def __init__(self, keys: list, states: list, written: list | None, group_of: bytes):
        self._keys, self._states, self._written, self._group_of = keys, states, written, group_of
        self._groups = dict.fromkeys(sorted(set(group_of)))
        self._by_group: dict[int, tuple[list, list, list]] | None = None

    def columns(self) -> tuple[list, list, list | None]:
        """(keys, states, write times or None), in the order taken."""
        return self._keys, self._states, self._written

    def fields(self, group: int) -> tuple[list, ...]:
        """The group's ``(keys, states, write times)``, in the order taken (none: it holds none)."""
        if self._by_group is None:
            split = [([], [], []) for _ in range(MAX_PARALLELISM)]
            keys, states = [columns[0].append for columns in split], [columns[1].append for columns in split]
            for at, key, state in zip(self._group_of, self._keys, self._states):
                keys[at](key)
                states[at](state)
            if self._written is not None:
                times = [columns[2].append for columns in split]
                for at, written in zip(self._group_of, self._written):
                    times[at](written)
            self._by_group = {at: columns if self._written is not None else (*columns[:2], [None] * len(columns[0]))
                              for at, columns in enumerate(split) if columns[0]}
        return self._by_group.get(group, ())

    def __getitem__(self, group: int) -> list[tuple]:
        if group not in self._groups:
            raise KeyError(group)
        return list(zip(*self.fields(group)))

    def __reduce__(self):
        return Columns, (self._keys, self._states, self._written, self._group_of)


def _stored_groups(parts: list[tuple[int, bytes]]) -> StoredGroups:
    return StoredGroups(dict(parts))


class Delta:
    """A step's snapshot holding what changed since the snapshot it builds on: entries
    ``written`` and ``removed`` by key group. :meth:`onto` adds it to the whole state of
    that snapshot; :func:`chain_onto` adds up a chain of them at once."""

    written: Mapping[int, list[tuple]]
    removed: Mapping[int, list]
    #: Entries told by their first field alone, which is what a removal holds: a chain
    #: of them adds up a column at a time (:func:`merged_by_key`).
    by_key = False

    def __post_init__(self):
        for field in ("written", "removed"):
            if type(getattr(self, field)) is dict:
                object.__setattr__(self, field, Groups(getattr(self, field)))

    def onto(self, whole: Any) -> Any:
        return chain_onto(whole, [self])

    def identity_of(self, entry: tuple) -> Any:
        """What tells an entry (a removal is that identity)."""
        raise NotImplementedError

    def groups_of(self, whole: Any) -> Mapping[int, list]:
        """The entries by key group of a whole state of the step."""
        raise NotImplementedError

    def with_groups(self, groups: Mapping[int, list]) -> Any:
        """The whole state holding ``groups`` and, whole, the rest of this snapshot."""
        raise NotImplementedError


def chain_onto(whole: Any, deltas: list[Delta], stop: threading.Event | None = None) -> Any:
    """The whole state ``whole`` (None: nothing) becomes with ``deltas`` applied in order,
    its groups added up as they are read (:class:`ChainedGroups`; ``stop``: see there)."""
    last = deltas[-1]
    return last.with_groups(ChainedGroups(last.groups_of(whole) if whole is not None else {}, deltas, stop))


class Stopped(Exception):
    """Adding up a chain was stopped from another thread (a compaction given up)."""


class ChainedGroups(LazyGroups):
    """The groups of a whole state with a chain of deltas applied in order, each added up
    when read: its entries indexed once for the whole chain (keyed steps' a column at a
    time: :func:`merged_by_key`), so a group costs its whole entries once plus its
    changes. A group no delta touches is the whole state's as it is (stored: its bytes are
    pickled again as they are). Once ``stop`` is set, pickling the next group raises
    :class:`Stopped`: a compaction given up on a thread that cannot be cancelled ends
    before the next key group, and leaves the cores to the restore that gave it up."""

    __slots__ = ("_whole", "_deltas", "_stop")

    def __init__(self, whole: Mapping[int, list], deltas: list[Delta], stop: threading.Event | None = None):
        self._whole, self._deltas, self._stop = whole, deltas, stop
        self._groups = dict.fromkeys(sorted(set(whole).union(*(delta.written.keys() for delta in deltas))))

    def _changing(self, group: int) -> list[Delta]:
        return [delta for delta in self._deltas if group in delta.written or group in delta.removed]

    def __getitem__(self, group: int) -> list:
        if group not in self._groups:
            raise KeyError(group)
        changing = self._changing(group)
        if not changing:
            return self._whole[group]
        if changing[0].by_key:
            return list(zip(*self.fields(group)))
        whole = self._whole.get(group, ())
        by_identity = dict(zip(map(changing[0].identity_of, whole), whole))
        for delta in changing:
            for removed in delta.removed.get(group, ()):
                by_identity.pop(removed, None)
            written = delta.written.get(group, ())
            by_identity.update(zip(map(delta.identity_of, written), written))
        return list(by_identity.values())

    def fields(self, group: int) -> tuple[list, ...]:
        """The group's entries added up, as columns: for entries told by their key, a
        column at a time (:func:`merged_by_key`), never as entries."""
        changing = self._changing(group)
        if not changing:
            return group_fields(self._whole, group)
        if not changing[0].by_key:
            return super().fields(group)
        return merged_by_key(group_fields(self._whole, group),
                             [(delta.removed.get(group, ()), group_fields(delta.written, group)) for delta in changing])

    def pickled(self, group: int) -> bytes | None:
        if self._stop is not None and self._stop.is_set():
            raise Stopped
        changing = self._changing(group)
        if not changing and isinstance(self._whole, LazyGroups):
            return self._whole.pickled(group)
        if changing and changing[0].by_key:
            fields = self.fields(group)
            return pickle.dumps(fields, pickle.HIGHEST_PROTOCOL) if fields and fields[0] else None
        return super().pickled(group)

    def in_layers(self) -> Iterator[tuple[Mapping[int, list], Mapping[int, list]]]:
        """The state as (removed, written) layers by key group, to apply in order: the whole
        state's entries, then each delta's changes; what a step whose entries are its
        state's own index applies in place, without the index :meth:`__getitem__` builds
        (and a delta's :class:`Columns` as they are)."""
        yield {}, self._whole
        for delta in self._deltas:
            yield delta.removed, delta.written


def in_layers(groups: Mapping[int, list]) -> Iterator[tuple[Mapping[int, list], Mapping[int, list]]]:
    """``groups`` as (removed, written) layers by key group to apply in order (see
    :meth:`ChainedGroups.in_layers`): one for groups already added up."""
    if isinstance(groups, (ChainedGroups, OwnedGroups)):
        return groups.in_layers()
    return iter([({}, groups)])


class OwnedGroups(LazyGroups):
    """The key groups ``groups`` of several old tasks' states (each group held by one of
    them, its owner then): what a task restored at another parallelism reads, a group at a
    time, without copying the rest. Its :meth:`in_layers` are each old state's, restricted."""

    __slots__ = ("_sources", "_owned", "_holder")

    def __init__(self, sources: list[Mapping[int, list]], groups: range):
        self._sources, self._owned = sources, groups
        self._holder = {group: source for source in sources for group in source if group in groups}
        self._groups = dict.fromkeys(sorted(self._holder))

    def __getitem__(self, group: int) -> list:
        return self._holder[group][group]

    def fields(self, group: int) -> tuple[list, ...]:
        return group_fields(self._holder[group], group) if group in self._holder else ()

    def pickled(self, group: int) -> bytes | None:
        holder = self._holder[group]
        return holder.pickled(group) if isinstance(holder, LazyGroups) else super().pickled(group)

    def in_layers(self) -> Iterator[tuple[Mapping[int, list], Mapping[int, list]]]:
        """Each old state's layers in turn, restricted to the groups owned (the old states
        hold none in common, so their layers apply in any order)."""
        for source in self._sources:
            for removed, written in in_layers(source):
                yield OwnedGroups([removed], self._owned), OwnedGroups([written], self._owned)


class RescaleShare:
    """The share of the old tasks' snapshots (:class:`OwnedGroups`) a rescaled processor's
    new task restored a step from: its first whole snapshot after the restore is that share
    with the changes since (:func:`chain_onto`: the stored bytes of a key group nothing
    changed go again as they are), not a pass over every entry held; kept until a snapshot
    of the step's own completes, which later ones build on."""

    def __init__(self):
        self.state: dict | None = None

    def restored(self, state: dict, groups: Mapping, changes: ChangeLog) -> None:
        """The step restored ``state``, whose entries by key group are ``groups``, and
        ``changes`` (reset) keeps its changes since (dropping the share if it forgets them)."""
        self.state = state if isinstance(groups, OwnedGroups) else None
        changes.share = self

    def base(self, base: int | None) -> int | None:
        """What a snapshot building on ``base`` holds the changes since: 0, the restore,
        for a whole one while the share is kept (a ChangeLog's changes since it)."""
        if base is not None:
            self.state = None  # a snapshot of the step's own completed: later ones build on it
            return base
        return None if self.state is None else 0

    def whole(self, delta: Delta) -> Any:
        """The snapshot: ``delta`` (the changes since :meth:`base`) onto the share, or as it is."""
        return delta if self.state is None else chain_onto(self.state, [delta])


@dataclass(frozen=True)
class KeyedDelta(Delta):
    """A keyed step's changes since the snapshot it builds on: the entries of the keys
    written (:class:`Columns`, or by key group) and the keys removed, by key group, and
    the step's watermark. A whole state is ``{"watermark": ..., "groups": {group: [(key,
    *entry)]}}``."""

    watermark: int
    written: Mapping[int, list[tuple]]
    removed: dict[int, list]

    identity_of = staticmethod(itemgetter(0))
    by_key = True

    def groups_of(self, whole: dict) -> Mapping[int, list]:
        return whole["groups"]

    def with_groups(self, groups: Mapping[int, list]) -> dict:
        return {"watermark": self.watermark, "groups": groups}


@dataclass(frozen=True)
class WindowDelta(Delta):
    """A window step's changes since the snapshot it builds on: the panes written
    (``(start, end, key, accumulator, count)``) and removed (``(start, end, key)``) by key
    group, and the rest of the step's state whole (``rest``: its snapshot without the
    operator's groups)."""

    written: dict[int, list[tuple]]
    removed: dict[int, list[tuple]]
    rest: dict

    identity_of = staticmethod(itemgetter(slice(0, 3)))  # a pane's (start, end, key)

    def groups_of(self, whole: dict) -> Mapping[int, list]:
        return whole["operator"]["groups"]

    def with_groups(self, groups: Mapping[int, list]) -> dict:
        return {**self.rest, "operator": {**self.rest["operator"], "groups": groups}}


@dataclass(frozen=True)
class JoinDelta(Delta):
    """A join's changes since the snapshot it builds on: the entries written and the
    identities removed, by key group (an entry's identity is its first ``identity``
    fields: side and key of a buffer, or the key of a table's versions), and the rest of
    the join's state whole (``rest``: its snapshot without ``groups``)."""

    written: dict[int, list[tuple]]
    removed: dict[int, list[tuple]]
    identity: int
    rest: dict

    def identity_of(self, entry: tuple) -> tuple:
        return entry[:self.identity]

    def groups_of(self, whole: dict) -> Mapping[int, list]:
        return whole["groups"]

    def with_groups(self, groups: Mapping[int, list]) -> dict:
        return {**self.rest, "groups": groups}


def grouped(keys: Iterable[Any], holds, entry) -> tuple[dict[int, list[tuple]], dict[int, list]]:
    """``keys`` by key group: (written: ``(key, *entry(key))`` of each key ``holds``,
    removed: the others)."""
    written: dict[int, list[tuple]] = {}
    removed: dict[int, list] = {}
    for key in keys:
        if holds(key):
            written.setdefault(key_group(key), []).append((key, *entry(key)))
        else:
            removed.setdefault(key_group(key), []).append(key)
    return written, removed


def keyed_share(states: list[dict | None], index: int, parallelism: int) -> dict:
    """Task ``index`` of ``parallelism``'s share of ``states`` (whole snapshots of one
    step, ``{"watermark": ..., "groups": {group: entries}, ...}``, by the tasks of another
    parallelism; None for an old task it does not read, see
    :func:`gearbus.runtime.savepoints.restored_from`): a view of the entries of the key
    groups it owns, read when restored, and the lowest watermark of those read."""
    read = [state for state in states if state is not None]
    return {"watermark": min(state["watermark"] for state in read),
            "groups": OwnedGroups([state["groups"] for state in read], owned_groups(index, parallelism))}


def inherited(states: list, index: int, parallelism: int) -> list:
    """Of ``states`` (every old task's, by old index; None: not read), those whose first key
    group task ``index`` of ``parallelism`` owns: what belongs to no key (counts of late
    records, say) goes on in exactly one new task, which reads that old task anyway."""
    groups = owned_groups(index, parallelism)
    return [state for old, state in enumerate(states)
            if state is not None and owned_groups(old, len(states)).start in groups]
