"""Key groups: the unit in which keyed state is snapshotted and redistributed (as in
Flink). Every key belongs to one of MAX_PARALLELISM groups, whatever the parallelism,
so a checkpoint taken with N tasks can be restored with M by handing out whole groups.
"""

from __future__ import annotations

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
