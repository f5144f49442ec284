"""Key groups: the unit in which keyed state is snapshotted and redistributed (as in
Flink). Every key belongs to one of MAX_PARALLELISM groups, whatever the parallelism,
so a checkpoint taken with N tasks can be restored with M by handing out whole groups.
"""

from __future__ import annotations

import copy
import itertools
import pickle
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gearbus.api.partitioners import key_group


#: Types a snapshot can share with live state instead of copying it.
IMMUTABLE_TYPES = frozenset({int, float, bool, str, bytes, type(None)})
#: Entries pickled to estimate a step's state bytes (cost bounded, whatever its size).
SIZE_SAMPLE = 32


def detached(value: Any) -> Any:
    """``value`` itself when it cannot change, else a deep copy: a snapshot stays valid
    while the step goes on (user code may update its state in place)."""
    return value if type(value) in IMMUTABLE_TYPES else copy.deepcopy(value)


def estimated_bytes(entries: Iterable[Any], count: int) -> int:
    """The pickled size of ``count`` entries, estimated from the first SIZE_SAMPLE of
    ``entries`` (an iterator over them): a metric cheap enough to take every second."""
    sample = list(itertools.islice(entries, SIZE_SAMPLE))
    if not sample:
        return 0
    return len(pickle.dumps(sample, pickle.HIGHEST_PROTOCOL)) * count // len(sample)


class ChangeLog:
    """The keys a keyed step changed (written, removed, or read as a value that can change
    in place), so a snapshot holds only what changed since the one it builds on.

    ``changed`` collects keys since the last snapshot; each snapshot keeps its set by
    checkpoint until its base moves past it (see :class:`gearbus.runtime.snapshots.Lineage`),
    so a snapshot building on checkpoint b holds every key changed since b's snapshot.

    What it remembers is bounded (:meth:`bound`): past a few times the keys held (many keys
    come and go, or no checkpoint completes, or checkpoints are off) it forgets, and the
    snapshots are whole until one taken after that becomes the base."""

    #: Changed keys remembered, beyond twice the keys held, before the log forgets them.
    SLACK = 1024

    def __init__(self):
        self.changed: set = set()
        self._taken: dict[int, set] = {}
        self._forgot = False  # since the last snapshot
        self._whole_before = 0  # snapshots building on an older base than this are whole

    def take(self, checkpoint_id: int | None, base: int | None) -> set | None:
        """The keys to snapshot for ``checkpoint_id`` building on ``base``'s snapshot
        (None: every key, a whole snapshot)."""
        changed = set(self.changed)
        self.changed.clear()
        if checkpoint_id is not None:
            self._taken[checkpoint_id] = changed
            if self._forgot:
                self._forgot, self._whole_before = False, checkpoint_id
        if base is None or base < self._whole_before or self._forgot:
            return None
        for old in [c for c in self._taken if c <= base]:
            del self._taken[old]
        return changed.union(*self._taken.values())

    def bound(self, held: int) -> None:
        """Forget the changes once they outnumber twice the ``held`` keys (plus SLACK)."""
        if len(self.changed) + sum(map(len, self._taken.values())) > 2 * held + self.SLACK:
            self.changed.clear()
            self._taken.clear()
            self._forgot = True

    def reset(self) -> None:
        """The step was restored: nothing changed since."""
        self.changed.clear()
        self._taken.clear()
        self._forgot, self._whole_before = False, 0


@dataclass(frozen=True)
class KeyedDelta:
    """A keyed step's changes since the snapshot it builds on: the entries of the keys
    written and the keys removed, by key group, and the step's watermark."""

    watermark: int
    written: dict[int, list[tuple]]
    removed: dict[int, list]

    def onto(self, whole: dict | None) -> dict:
        """The whole state (``{"watermark": ..., "groups": {group: [(key, *entry)]}}``)
        ``whole`` becomes with these changes."""
        groups = dict(whole["groups"]) if whole is not None else {}
        for group in self.written.keys() | self.removed.keys():
            by_key = {entry[0]: entry for entry in groups.get(group, ())}
            for key in self.removed.get(group, ()):
                by_key.pop(key, None)
            for entry in self.written.get(group, ()):
                by_key[entry[0]] = entry
            if by_key:
                groups[group] = list(by_key.values())
            else:
                groups.pop(group, None)
        return {"watermark": self.watermark, "groups": groups}


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


def regrouped(states: list[dict], groups: range | set) -> dict[int, list]:
    """The entries of key groups ``groups`` in ``states`` (whole snapshots of one step,
    ``{"groups": {group: entries}, ...}``, by several tasks): one task's share of them at
    another parallelism. A task holds one contiguous range of groups, so at most a few of
    ``states`` contribute."""
    return {group: entries for state in states for group, entries in state["groups"].items() if group in groups}
