"""A task's snapshot envelope: what one task stores for a checkpoint and restores from.

Written by the executor (to the JetStream object store) and the TestRunner (in memory),
read back by both on recovery, and made by the AppMaster when a savepoint seeds an
app's first checkpoint. Encoded as a versioned pickled tuple: the task's state is the
user's objects, whatever pickle can carry.

Snapshots are incremental: a keyed step's state in an envelope may hold only what changed
since the snapshot of the task's last completed checkpoint (``base``), which may itself
build on an older one. The AppMaster compacts a completed checkpoint's deep chains in the
background: it replaces the snapshot with the whole state its chain adds up to (same
object, same state, no base), and tells the tasks, whose later snapshots then have a
shorter chain rooted there. A chain is never longer than :data:`MAX_DEPTH`: a task whose
base is that deep (its compaction fell behind) takes a whole snapshot itself.
:class:`Lineage` decides, per task and without I/O, what each snapshot builds on.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass, replace
from typing import Any

from gearbus.api.watermarks import WATERMARK_MIN

#: 6: the envelope names the task's local copies of its state on disk (``copies``);
#: 5: the envelope carries the records a task held for another version's code (``held``);
#: 4: a keyed step's changes may be columns with a key group per entry
#: (gearbus.runtime.keygroups.Columns), and a group's entries are pickled as columns;
#: 3: entries by key group pickled a group at a time (gearbus.runtime.keygroups.Groups);
#: 2: the same tuple, groups as dicts (all still read, as is 1).
FORMAT = 6
#: The longest chain of snapshots building on each other; a restore reads at most this
#: many plus one per task (and, by the compaction's rule, about one and a half times the
#: whole state's bytes: see gearbus.runtime.checkpoints).
MAX_DEPTH = 64
#: The depth at which the AppMaster compacts a completed checkpoint's snapshots whatever
#: their bytes. Well below MAX_DEPTH: a compaction of tens of millions of keys takes a
#: minute or more, through which the chains grow, and a task reaching MAX_DEPTH snapshots
#: all it holds.
COMPACT_DEPTH = 16


@dataclass(frozen=True)
class TaskSnapshot:
    """``state``: what ``Task.snapshot()`` returned (None: nothing to restore, a savepoint
    held no state for the task); ``ended``: taken after the task's end; ``watermark``:
    the task's watermark at the barrier.

    ``epoch``: the attempt that took it (None: unknown, a seeded or older envelope, which
    nothing builds on); ``base``: (checkpoint id, epoch) of the snapshot this one's changes
    apply to, None for a whole one; ``depth``: snapshots between it and its ``root``, the
    checkpoint id of the whole snapshot its chain starts from (0: itself).

    ``held``: (T, records) when the task held back its input records of event time T and
    later for a replacement's new code (``gearbus replace --at T``): the task restoring it
    processes them first (and its steps saw the watermark only up to T - 1).

    ``copies``: where local copies of the state on disk are (gearbus/runtime/local_copies.py):
    the one the task kept as it took this snapshot; in an envelope to restore, those a
    restoring task may take state from (after a rescale, the old tasks' it reads)."""

    checkpoint_id: int
    state: Any
    ended: bool
    watermark: int
    epoch: int | None = None
    base: tuple[int, int] | None = None
    depth: int = 0
    root: int = 0
    held: tuple[int, tuple] | None = None
    copies: tuple[str, ...] = ()

    @classmethod
    def seeded(cls, checkpoint_id: int, state: Any) -> TaskSnapshot:
        """A fresh task's envelope carrying ``state`` (from a savepoint)."""
        return cls(checkpoint_id, state, False, WATERMARK_MIN)

    @property
    def link(self) -> Link | None:
        """What a later snapshot of the task may build on, if anything."""
        return None if self.epoch is None else \
            Link(self.checkpoint_id, self.epoch, self.depth, self.root or self.checkpoint_id,
                 self.base[0] if self.base is not None else None)

    def encode(self) -> bytes:
        """Bytes to store; raises whatever pickle raises when the state cannot be serialised."""
        return pickle.dumps((FORMAT, self.checkpoint_id, self.state, self.ended, self.watermark, self.epoch,
                             self.base, self.depth, self.root, self.held, self.copies), pickle.HIGHEST_PROTOCOL)

    @classmethod
    def decode(cls, data: bytes) -> TaskSnapshot:
        """The inverse of :meth:`encode` (an envelope of format 1, without lineage, reads as
        a whole snapshot nothing builds on; one of format 2 as it was); ValueError for
        bytes of another format. An older gearbus reading a later format fails: pickle
        cannot find the class of its groups, or its columns."""
        loaded = pickle.loads(data)
        if type(loaded) is tuple and len(loaded) == 5 and loaded[0] == 1:
            _, checkpoint_id, state, ended, watermark = loaded
            return cls(checkpoint_id, state, ended, watermark)
        if type(loaded) is tuple and len(loaded) == 9 and loaded[0] in (2, 3, 4):
            loaded = (*loaded, None)
        if type(loaded) is tuple and len(loaded) == 10 and loaded[0] in (2, 3, 4, 5):
            loaded = (*loaded, ())
        if type(loaded) is not tuple or len(loaded) != 11 or loaded[0] not in (2, 3, 4, 5, FORMAT):
            raise ValueError(f"not a task snapshot of format {FORMAT}")
        _, checkpoint_id, state, ended, watermark, epoch, base, depth, root, held, copies = loaded
        return cls(checkpoint_id, state, ended, watermark, epoch, tuple(base) if base is not None else None,
                   depth, root, held, tuple(copies))

    def whole(self, state: Any) -> TaskSnapshot:
        """This envelope holding ``state``, the whole state its chain adds up to (its lineage
        kept: later snapshots of the task build on the stored chain)."""
        return replace(self, state=state)

    def self_contained(self) -> TaskSnapshot:
        """This (whole) envelope as one that needs no other: to hand to another engine, or
        to store in place of a chain's newest snapshot (a compaction)."""
        return replace(self, base=None, depth=0, root=0)


@dataclass(frozen=True)
class Link:
    """A stored snapshot of a task, as a later one may build on it: its chain is ``depth``
    snapshots long down to ``root``, through the snapshot of checkpoint ``base``."""

    checkpoint_id: int
    epoch: int
    depth: int
    root: int
    base: int | None = None


class Lineage:
    """Which stored snapshot a task's next snapshot builds on: the one of the last
    checkpoint that completed (or was restored), unless its chain is :data:`MAX_DEPTH`
    deep. A snapshot builds only on a completed checkpoint's: an abandoned checkpoint's
    objects are discarded, a completed one's are kept while a kept checkpoint needs them.

    It keeps the links of the base's chain and of the snapshots taken since, so that a
    compaction (:meth:`compacted`) shortens exactly the chains that pass through it."""

    def __init__(self, max_depth: int = MAX_DEPTH):
        self.max_depth = max_depth
        self.base: Link | None = None
        self._links: dict[int, Link] = {}  # the base's chain and the snapshots taken since, by checkpoint
        #: the last whole snapshot taken: a completion of an older checkpoint, come late, is
        #: not a base any more (what it read may be pruned once the whole one completed)
        self._floor = 0

    def plan(self, checkpoint_id: int, epoch: int) -> tuple[Link, Link | None]:
        """The snapshot of ``checkpoint_id`` about to be taken: its link, and the base it
        holds the changes since (None: it holds everything)."""
        base = self.base
        if base is not None and (base.depth >= self.max_depth or base.checkpoint_id < self._floor):
            base = None  # too deep; or older than a whole snapshot taken since, which may reach the AppMaster first
        if base is None:
            return self._whole(checkpoint_id, epoch), None
        link = self._links[checkpoint_id] = Link(checkpoint_id, epoch, base.depth + 1, base.root, base.checkpoint_id)
        return link, base

    def _whole(self, checkpoint_id: int, epoch: int) -> Link:
        """A whole snapshot of ``checkpoint_id``: its chain starts there, and no later one
        builds on an older base."""
        link = self._links[checkpoint_id] = Link(checkpoint_id, epoch, 0, checkpoint_id)
        self._floor = checkpoint_id
        return link

    def taken_whole(self, checkpoint_id: int) -> Link:
        """The snapshot just planned for ``checkpoint_id`` turned out whole (nothing in
        the task keeps track of changes, or every step snapshotted all it holds): it
        builds on nothing, so its chain starts there. Its ack names it as the task's root,
        so no later snapshot may build on an older base (:meth:`plan`): the AppMaster may
        prune what that base reads."""
        return self._whole(checkpoint_id, self._links[checkpoint_id].epoch)

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: later snapshots build on its."""
        link = self._links.get(checkpoint_id)
        if link is None or checkpoint_id < self._floor or \
                (self.base is not None and checkpoint_id <= self.base.checkpoint_id):
            return
        self.base = link
        chain, at = set(), link
        while at is not None:
            chain.add(at.checkpoint_id)
            at = self._links.get(at.base) if at.base is not None else None
        self._links = {c: kept for c, kept in self._links.items() if c in chain or c > checkpoint_id}

    def compacted(self, checkpoint_id: int) -> None:
        """The stored snapshot of ``checkpoint_id`` now holds the whole state: every chain
        through it ends there (the stored envelopes of later snapshots keep their older
        root, which only keeps more stored)."""
        link = self._links.get(checkpoint_id)
        if link is None or link.base is None:
            return
        self._links[checkpoint_id] = Link(checkpoint_id, link.epoch, 0, checkpoint_id)
        for later in sorted(c for c in self._links if c > checkpoint_id):
            kept = self._links[later]
            base = self._links.get(kept.base) if kept.base is not None else None
            if base is not None:
                self._links[later] = Link(later, kept.epoch, base.depth + 1, base.root, base.checkpoint_id)
        if self.base is not None:
            self.base = self._links.get(self.base.checkpoint_id, self.base)

    def restored(self, link: Link | None) -> None:
        """The task was restored from the snapshot ``link`` (None: one nothing builds on)."""
        self.base = link
        self._links = {link.checkpoint_id: link} if link is not None else {}
        self._floor = 0
