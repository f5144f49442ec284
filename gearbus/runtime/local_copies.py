"""Task-local copies of state on disk: what a task restoring a checkpoint takes instead of
writing every key back from the checkpoint store, so that across a rescale only the key
groups that change owner move (Flink's task-local recovery, applied to rescaling).

When a task on the rocksdb backend snapshots for a checkpoint, it also keeps a copy of its
databases as they are at the barrier: a RocksDB checkpoint (the memtable written out, the
files hard-linked, not copied), under its process's scratch directory, with a manifest of
the key groups it owned and how many keys each held. The stored snapshot names the copy
(``TaskSnapshot.copies``: host and path). A task restoring that checkpoint on the same host
(its own after a failure, or the old tasks' whose key groups it takes after a rescale)
clones each copied database holding some of its groups (hard links again) and removes the
groups it does not take from it (range deletes): it then keeps one database per old task
(up to RocksDBTable's MAX_PARTS; further ones' groups are copied in raw), and no entry
moves or is unpickled. Whatever no copy holds (another host, a copy pruned or
never kept, a step that cannot take one) is loaded from the store as before: copies make a
restore faster, never different.

A copy outlives its task (the next epoch's tasks read it). Copies of checkpoints older
than the last completed one are pruned as later ones complete (no restore goes back past
it), and a task keeps at most :data:`COPIES_KEPT` of its own (checkpoints that keep failing
leave no more).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass

#: The directory under a state root that holds the copies.
COPIES_DIR = "copies"
#: The copies a task keeps of its own at most (the newest).
COPIES_KEPT = 3
MANIFEST = "manifest.json"
#: The files of a RocksDB database that never change once written (linked into a clone,
#: where the others are copied).
_IMMUTABLE_SUFFIX = ".sst"


@dataclass(frozen=True)
class Copy:
    """A copy found on this host: where it is, the key groups its task owned, and each
    step's databases in it (``{step: (their directories, which one holds each key group,
    the keys in each key group)}``)."""

    path: str
    owned: range
    tables: dict[str, tuple[list[str], list[int], list[int]]]

    def overlap(self, groups: range) -> range:
        return range(max(self.owned.start, groups.start), min(self.owned.stop, groups.stop))


def keep(root: str, label: str, checkpoint_id: int, owned: range,
         tables: Iterable[tuple[str, list, list[int], list[int]]]) -> str:
    """Keep a copy of a task's ``tables`` ((step, its open databases with nothing waiting,
    which one holds each key group, the keys in each key group)) for checkpoint
    ``checkpoint_id``; its locator (``host:path``). The manifest is written last (a copy
    without one is not used); a copy that fails is removed."""
    import rocksdict

    parent = os.path.join(root, COPIES_DIR)
    os.makedirs(parent, exist_ok=True)
    path = tempfile.mkdtemp(prefix=f"c{checkpoint_id}-{label}-", dir=parent)
    try:
        steps = {}
        for number, (step, databases, part_index, counts) in enumerate(tables):
            directories = [f"step{number}.{part}" for part in range(len(databases))]
            for db, directory in zip(databases, directories):
                rocksdict.Checkpoint(db).create_checkpoint(os.path.join(path, directory))
            steps[step] = [directories, list(part_index), list(counts)]
        written = os.path.join(path, MANIFEST + ".new")
        with open(written, "w") as file:
            json.dump({"owned": [owned.start, owned.stop], "tables": steps}, file)
        os.replace(written, os.path.join(path, MANIFEST))
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return f"{socket.gethostname()}:{path}"


def found(locators: Iterable[str]) -> list[Copy]:
    """The copies named that this host holds whole (another host's, or one pruned or not
    finished, is not found: its groups come from the store)."""
    host, copies = socket.gethostname(), []
    for locator in locators:
        at, _, path = locator.partition(":")
        if at != host:
            continue
        try:
            with open(os.path.join(path, MANIFEST)) as file:
                manifest = json.load(file)
        except (OSError, ValueError):
            continue
        start, stop = manifest["owned"]
        copies.append(Copy(path, range(start, stop), {step: tuple(table) for step, table in manifest["tables"].items()}))
    return copies


def clone(source: str, target: str) -> None:
    """A database directory as a new one: its immutable files hard-linked, the others copied."""
    os.makedirs(target)
    for name in os.listdir(source):
        link_or_copy = os.link if name.endswith(_IMMUTABLE_SUFFIX) else shutil.copy2
        link_or_copy(os.path.join(source, name), os.path.join(target, name))


def prune(root: str | None, completed: int) -> None:
    """Remove the copies under ``root`` of checkpoints before ``completed`` (a completed
    one): no restore reads them any more."""
    if root is None:
        return
    parent = os.path.join(root, COPIES_DIR)
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        number = name[1:].split("-", 1)[0]
        if number.isdigit() and int(number) < completed:
            shutil.rmtree(os.path.join(parent, name), ignore_errors=True)


def runs(groups: list[int]) -> list[tuple[int, int]]:
    """Sorted key groups as ranges (start, stop) of consecutive ones."""
    found: list[tuple[int, int]] = []
    for group in groups:
        if found and found[-1][1] == group:
            found[-1] = (found[-1][0], group + 1)
        else:
            found.append((group, group + 1))
    return found


def path_of(locator: str) -> str:
    return locator.partition(":")[2]
