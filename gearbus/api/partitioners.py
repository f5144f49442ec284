"""Partitioners decide which downstream task receives each record (Gearpump's).

A custom partitioner subclasses :class:`Partitioner` and implements
:meth:`Partitioner.partition`; the runtime calls :meth:`Partitioner.route` once per
batch, which built-in partitioners override for speed.
"""

from __future__ import annotations

import sys
import zlib
from collections.abc import Collection, Iterator
from itertools import repeat
from operator import and_

from gearbus.api.task import Record


def _crc_hash(key) -> int:
    return zlib.crc32(repr(key).encode())


def _fixed_seed_hash(key) -> int:
    return 0 if key is None else hash(key)


#: A hash that agrees across processes. Workers start executors with PYTHONHASHSEED=0,
#: so the built-in hash is stable there (as PySpark requires); elsewhere fall back to CRC.
stable_hash = _crc_hash if sys.flags.hash_randomization else _fixed_seed_hash


#: The number of key groups, and so the largest parallelism of a hash-partitioned
#: processor. Part of every checkpoint's layout: it must never change. A power of two
#: (:func:`key_groups` masks by it).
MAX_PARALLELISM = 128


#: How keys map to tasks, recorded with each savepoint: 1, ``stable_hash(key) % n`` (before
#: gearbus routed by key-group ranges); 2, the owner of the key's group (:func:`group_owner`).
KEY_LAYOUT = 2


def key_group(key) -> int:
    """The key group of ``key``, in ``range(MAX_PARALLELISM)``: the unit in which keyed
    state is routed, snapshotted and handed between tasks (as in Flink).

    It must never change (nor may :func:`stable_hash`), or the state of restored
    checkpoints lands in the wrong group. It agrees across processes where
    ``stable_hash`` does: executors run with PYTHONHASHSEED=0.
    """
    return stable_hash(key) % MAX_PARALLELISM


def key_groups(keys: Collection) -> Iterator[int]:
    """:func:`key_group` of each of ``keys``, in order. Where the built-in hash is stable
    (executors) and no key is None, computed without a Python call per key: a checkpoint
    groups every key changed since the last, and the call was most of that."""
    if stable_hash is _fixed_seed_hash and None not in keys:
        return map(and_, map(hash, keys), repeat(MAX_PARALLELISM - 1))  # x % 2**n == x & (2**n - 1)
    return map(key_group, keys)


def group_owner(group: int, num_partitions: int) -> int:
    """The task of ``num_partitions`` owning key group ``group``: each task owns one
    contiguous range of groups (:func:`owned_groups`), so a task restored at another
    parallelism reads the snapshots of at most a few old tasks."""
    return group * num_partitions // MAX_PARALLELISM


def owned_groups(index: int, num_partitions: int) -> range:
    """The key groups task ``index`` of ``num_partitions`` owns (the inverse of
    :func:`group_owner`)."""
    return range(-(-index * MAX_PARALLELISM // num_partitions), -(-(index + 1) * MAX_PARALLELISM // num_partitions))


def key_owner(key, num_partitions: int) -> int:
    """The task of ``num_partitions`` that a hash edge sends ``key`` to (and that so holds
    its state downstream of a ``group_by``): the owner of its key group."""
    return group_owner(key_group(key), num_partitions)


class Partitioner:
    """Base of all partitioners."""

    #: True when the partitioner needs upstream and downstream parallelism to match.
    requires_equal_parallelism = False

    def partition(self, record: Record, num_partitions: int, current_index: int) -> int:
        """Return the index of the downstream task that receives ``record``."""
        raise NotImplementedError

    def route(self, records: list[Record], num_partitions: int, current_index: int) -> list[list[Record]]:
        """Split a batch into one list per downstream task."""
        buckets: list[list[Record]] = [[] for _ in range(num_partitions)]
        for record in records:
            index = self.partition(record, num_partitions, current_index)
            if not 0 <= index < num_partitions:
                raise ValueError(
                    f"{type(self).__name__}.partition returned {index}, outside 0..{num_partitions - 1}"
                )
            buckets[index].append(record)
        return buckets

    def describe(self) -> str:
        return type(self).__name__

    def emitting_steps(self) -> list[str] | None:
        """The steps whose output this edge sends when they are not its task's own (None)."""
        return None


class HashPartitioner(Partitioner):
    """Records with equal keys (the value when a record has no key) go to one task.

    ``by_key``: always the key, None included: the edges the planner makes after a
    ``group_by`` or into a join, where None is a key like any other.
    """

    def __init__(self, by_key: bool = False):
        self.by_key = by_key

    def partition(self, record: Record, num_partitions: int, current_index: int) -> int:
        return key_owner(record.value if record.key is None and not self.by_key else record.key, num_partitions)

    def route(self, records, num_partitions, current_index):
        if num_partitions == 1:
            return [records]
        buckets: list[list[Record]] = [[] for _ in range(num_partitions)]
        appends = [buckets[group_owner(group, num_partitions)].append for group in range(MAX_PARALLELISM)]
        h, groups = stable_hash, MAX_PARALLELISM
        if self.by_key:
            for record in records:
                appends[h(record[2]) % groups](record)
            return buckets
        for record in records:
            key = record[2]
            appends[h(record[0] if key is None else key) % groups](record)
        return buckets


class IntermediateStream(HashPartitioner):
    """A hash edge through a JetStream stream the app owns (Samza's intermediate stream):
    ``partitions`` subjects ``<stream>.<n>``; the planner names and sizes it, and the
    processors on its two sides are in different stages."""

    def __init__(self, edge: str, partitions: int = 0, stream: str = ""):
        super().__init__(by_key=True)
        self.edge = edge  # the step (or join side) whose records it carries
        self.partitions = partitions
        self.stream = stream

    @property
    def subjects(self) -> str:
        return f"{self.stream}.*"

    def describe(self) -> str:
        return f"IntermediateStream {self.stream} ({self.partitions} partitions)"


class ShufflePartitioner(Partitioner):
    """Round-robin: spreads records evenly whatever their keys."""

    def __init__(self):
        self._next = 0

    def partition(self, record, num_partitions, current_index):
        self._next = (self._next + 1) % num_partitions
        return self._next

    def route(self, records, num_partitions, current_index):
        start = self._next
        self._next = (start + len(records)) % num_partitions
        return [records[(i - start) % num_partitions :: num_partitions] for i in range(num_partitions)]


class BroadcastPartitioner(Partitioner):
    """Every downstream task receives every record."""

    def partition(self, record, num_partitions, current_index):
        raise TypeError("BroadcastPartitioner sends to every task; use route()")

    def route(self, records, num_partitions, current_index):
        return [records] * num_partitions


class CoLocationPartitioner(Partitioner):
    """Task i sends to downstream task i: upstream and downstream parallelism must match."""

    requires_equal_parallelism = True

    def partition(self, record, num_partitions, current_index):
        return current_index

    def route(self, records, num_partitions, current_index):
        buckets: list[list[Record]] = [[] for _ in range(num_partitions)]
        buckets[current_index] = records
        return buckets
