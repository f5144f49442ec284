"""Key groups: the unit in which keyed state is snapshotted and redistributed (as in
Flink). Every key belongs to one of MAX_PARALLELISM groups, whatever the parallelism,
so a checkpoint taken with N tasks can be restored with M by handing out whole groups.
"""

from __future__ import annotations

import copy
import itertools
import pickle
from collections.abc import Iterable
from typing import Any

from gearbus.api.partitioners import stable_hash

#: The number of key groups, and so the largest parallelism keyed state can be restored
#: to. Part of every checkpoint's layout: it must never change.
MAX_PARALLELISM = 128


def key_group(key: Any) -> int:
    """The key group of ``key``, in ``range(MAX_PARALLELISM)``.

    It must never change (nor may :func:`stable_hash`), or the state of restored
    checkpoints lands in the wrong group. It agrees across processes where
    ``stable_hash`` does: executors run with PYTHONHASHSEED=0.
    """
    return stable_hash(key) % MAX_PARALLELISM


#: Types a snapshot can share with live state instead of copying it.
_IMMUTABLE = frozenset({int, float, bool, str, bytes, type(None)})
#: Entries pickled to estimate a step's state bytes (cost bounded, whatever its size).
SIZE_SAMPLE = 32


def detached(value: Any) -> Any:
    """``value`` itself when it cannot change, else a deep copy: a snapshot stays valid
    while the step goes on (user code may update its state in place)."""
    return value if type(value) in _IMMUTABLE else copy.deepcopy(value)


def estimated_bytes(entries: Iterable[Any], count: int) -> int:
    """The pickled size of ``count`` entries, estimated from the first SIZE_SAMPLE of
    ``entries`` (an iterator over them): a metric cheap enough to take every second."""
    sample = list(itertools.islice(entries, SIZE_SAMPLE))
    if not sample:
        return 0
    return len(pickle.dumps(sample, pickle.HIGHEST_PROTOCOL)) * count // len(sample)
