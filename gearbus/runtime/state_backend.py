"""State backends: where a task's keyed state lives between checkpoints.

``memory`` (the default) keeps each step's entries in a dict: the fastest hot path, and
all state in the executor's heap. ``lmdb`` keeps them in an LMDB database under the task's
scratch directory (the worker's work directory for the executor), so state can outgrow the
heap; the task's files are removed when it stops. Both hand the operators a mapping
(:class:`Table`), and both snapshot into the same format (see keygroups.py), so a
checkpoint or savepoint taken with one restores with the other.

Why LMDB and not RocksDB (``rocksdict``): ``bench/state_backends.py`` measured, on this
machine, a read-modify-write per record over 2,000,000 keys at 174-189K operations/s with
LMDB against 69-95K with RocksDB (bloom filters and a 128 MiB block cache did not close
the gap): a B+-tree read is one walk of a memory map, while an LSM read walks memtables
and levels from Python one call at a time. The price: LMDB's pages are a memory-mapped
file, so the pages a task touched count in its resident memory as file cache (the kernel
reclaims them under pressure), where RocksDB would bound them by its block cache.

The table writes back: entries written, removed, or read as values that can change in
place (user code may update a state object without assigning it) wait in a dict until
:meth:`LmdbTable.settle` finds more than ``flush_entries`` of them, between batches, and
are then written in one transaction. A read reads that dict first, so hot keys cost a
dict lookup.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import shutil
import tempfile
from collections.abc import Iterator, MutableMapping
from typing import Any

import lmdb

from gearbus.api.partitioners import key_group
from gearbus.runtime.keygroups import IMMUTABLE_TYPES, UnserialisableState, estimated_bytes

#: The backends an app may name in ``config={"state_backend": ...}``.
BACKENDS = ("memory", "lmdb")
#: The cluster's default when an app names none (set it on the workers' processes).
BACKEND_ENV = "GEARBUS_STATE_BACKEND"
#: Entries a table holds in memory before :meth:`LmdbTable.settle` writes them out.
FLUSH_ENTRIES = 16384
#: LMDB's largest key; an encoded key past it is stored by its digest (see encode_key).
MAX_KEY_BYTES = 500
#: The size LMDB may map: address space only, the file grows with what it holds.
MAP_SIZE = 1 << 40

_REMOVED = object()
_MISSING = object()


class StateBackendError(OSError):
    """The backend cannot read or write its files (disk full, directory unwritable): an
    OSError, so the app rolls back to its last checkpoint, with this as the reason."""


def backend_name(config: dict) -> str:
    """The backend ``config`` names, else the cluster default (:data:`BACKEND_ENV`), else
    ``memory``; ValueError naming the choices for any other."""
    name = config.get("state_backend") or os.environ.get(BACKEND_ENV) or "memory"
    if name not in BACKENDS:
        source = "application config state_backend" if config.get("state_backend") else BACKEND_ENV
        raise ValueError(f"{source} must be one of {', '.join(BACKENDS)}, got {name!r}")
    return name


class MemoryBackend:
    """Each step's entries in a dict."""

    name = "memory"

    def table(self, step: str) -> dict:
        return {}

    def close(self) -> None:
        """Nothing to remove."""


class LmdbBackend:
    """One LMDB environment per task, a named database per step, in a directory of its
    own under ``root`` (made when the first table opens, removed by :meth:`close`)."""

    name = "lmdb"

    def __init__(self, root: str | None, label: str, flush_entries: int = FLUSH_ENTRIES, map_size: int = MAP_SIZE):
        self.root = root
        self.label = label
        self.flush_entries = flush_entries
        self.map_size = map_size
        self.directory: str | None = None
        self.env = None
        self._reader = None

    def table(self, step: str) -> LmdbTable:
        if self.env is None:
            try:
                if self.root is not None:
                    os.makedirs(self.root, exist_ok=True)
                self.directory = tempfile.mkdtemp(prefix=f"{self.label}-", dir=self.root)
                self.env = lmdb.open(self.directory, map_size=self.map_size, max_dbs=256, sync=False, metasync=False,
                                     readahead=False)
            except (OSError, lmdb.Error) as exc:
                raise StateBackendError(f"the lmdb state backend cannot open its files under "
                                        f"{self.root or tempfile.gettempdir()}: {exc}") from exc
        return LmdbTable(self, step)

    def reader(self):
        """A read transaction seeing every committed write."""
        if self._reader is None:
            self._reader = self.env.begin()
        return self._reader

    def committed(self) -> None:
        """A write transaction committed: later reads must see it."""
        if self._reader is not None:
            self._reader.abort()
            self._reader = None

    def failed(self, doing: str, exc: Exception) -> StateBackendError:
        return StateBackendError(f"the lmdb state backend at {self.directory} failed {doing}: "
                                 f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Close the environment and remove the task's files."""
        if self._reader is not None:
            self._reader.abort()
            self._reader = None
        if self.env is not None:
            self.env.close()
            self.env = None
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def open_backend(name: str, root: str | None, label: str):
    """A task's backend: ``root`` is the directory its files go under (None: the system's
    temporary directory), ``label`` names its own directory there."""
    if name == "memory":
        return MemoryBackend()
    if name == "lmdb":
        return LmdbBackend(root, label)
    raise ValueError(f"unknown state backend {name!r} (one of {', '.join(BACKENDS)})")


def encode_key(key) -> bytes:
    """``key`` as LMDB stores it: its key group (so a group's entries are one range), then
    its type and bytes; equal keys encode alike (pickled without memo). A key too long for
    LMDB is stored by its digest, its value paired with the key itself."""
    kind = type(key)
    if kind is str:
        body = b"s" + key.encode("utf-8", "surrogatepass")
    elif kind is int:
        body = b"i" + str(key).encode()
    elif kind is bytes:
        body = b"b" + key
    else:
        buffer = io.BytesIO()
        pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
        pickler.fast = True
        pickler.dump(key)
        body = b"p" + buffer.getvalue()
    encoded = key_group(key).to_bytes(2, "big") + body
    if len(encoded) > MAX_KEY_BYTES:
        return encoded[:2] + b"h" + hashlib.blake2b(body, digest_size=32).digest()
    return encoded


def decode_entry(encoded: bytes, raw: bytes) -> tuple[Any, Any]:
    """The (key, value) an LMDB entry stores (inverse of :func:`encode_key` and the table's
    value encoding)."""
    kind, body = encoded[2:3], encoded[3:]
    if kind == b"h":
        return pickle.loads(raw)
    value = pickle.loads(raw)
    if kind == b"s":
        return body.decode("utf-8", "surrogatepass"), value
    if kind == b"i":
        return int(body), value
    if kind == b"b":
        return bytes(body), value
    return pickle.loads(body), value


class LmdbTable(MutableMapping):
    """One step's entries in the task's LMDB environment, written back (see the module
    docstring). ``len`` counts the stored entries plus those waiting to be written that
    may be new: exact after :meth:`flush`, an upper bound between."""

    def __init__(self, backend: LmdbBackend, step: str):
        self.backend = backend
        self.step = step
        try:
            self._db = backend.env.open_db(step.encode("utf-8", "surrogatepass") or b"-")
        except Exception as exc:
            raise backend.failed(f"opening the table of step {step!r}", exc) from exc
        self._pending: dict[Any, Any] = {}  # key -> value, or _REMOVED
        self._stored = 0

    def get(self, key, default=None):
        value = self._pending.get(key, _MISSING)
        if value is _MISSING:
            encoded = encode_key(key)
            raw = self.backend.reader().get(encoded, db=self._db)
            if raw is None:
                return default
            value = pickle.loads(raw) if encoded[2:3] != b"h" else pickle.loads(raw)[1]
            if type(value) not in IMMUTABLE_TYPES:
                self._pending[key] = value  # user code may change it in place
            return value
        return default if value is _REMOVED else value

    def __getitem__(self, key):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            raise KeyError(key)
        return value

    def __contains__(self, key) -> bool:
        return self.get(key, _MISSING) is not _MISSING

    def __setitem__(self, key, value) -> None:
        self._pending[key] = value

    def __delitem__(self, key) -> None:
        if key not in self:
            raise KeyError(key)
        self._pending[key] = _REMOVED

    def pop(self, key, default=_MISSING):
        value = self.get(key, _MISSING)
        if value is _MISSING:
            if default is _MISSING:
                raise KeyError(key)
            return default
        self._pending[key] = _REMOVED
        return value

    def __len__(self) -> int:
        return self._stored + sum(1 for value in self._pending.values() if value is not _REMOVED)

    def __iter__(self) -> Iterator:
        return (key for key, _ in self.items())

    def items(self) -> Iterator[tuple[Any, Any]]:  # type: ignore[override]
        """Every entry: those waiting, then the stored ones not waiting (by key group).
        Nothing is written out, so a value that cannot be written fails where it would
        with the memory backend (the checkpoint), not here."""
        waiting = dict(self._pending)
        for key, value in waiting.items():
            if value is not _REMOVED:
                yield key, value
        with self.backend.env.begin(db=self._db) as txn:
            for encoded, raw in txn.cursor():
                key, value = decode_entry(encoded, raw)
                if key not in waiting:
                    yield key, value

    def size(self) -> tuple[int, int]:
        """(keys, bytes) for the metrics, without writing anything out: the pages the
        table's entries fill, and the pickled size of those waiting, estimated. Nothing
        once the task closed its backend (the metrics may still ask)."""
        if self.backend.env is None:
            return 0, 0
        try:
            with self.backend.env.begin() as txn:
                stat = txn.stat(self._db)
        except Exception as exc:
            raise self.backend.failed(f"reading the size of step {self.step!r}", exc) from exc
        pages = stat["branch_pages"] + stat["leaf_pages"] + stat["overflow_pages"]
        waiting = estimated_bytes(iter(self._pending.items()), len(self._pending))
        return len(self), pages * stat["psize"] + waiting

    def clear(self) -> None:
        self._pending.clear()
        try:
            with self.backend.env.begin(write=True) as txn:
                txn.drop(self._db, delete=False)
        except Exception as exc:
            raise self.backend.failed(f"clearing the table of step {self.step!r}", exc) from exc
        self._stored = 0
        self.backend.committed()

    def settle(self) -> None:
        """Between batches: write the waiting entries out once there are many."""
        if len(self._pending) > self.backend.flush_entries:
            self.flush()

    def flush(self) -> None:
        """Write every waiting entry in one transaction. A value pickle refuses fails the
        step, naming it, the key and the type; a failing disk raises StateBackendError."""
        if not self._pending:
            return
        puts = []
        for key, value in self._pending.items():
            encoded = encode_key(key)
            if value is _REMOVED:
                puts.append((encoded, None))
                continue
            try:
                raw = pickle.dumps((key, value) if encoded[2:3] == b"h" else value, pickle.HIGHEST_PROTOCOL)
            except Exception as exc:
                raise UnserialisableState(
                    f"step {self.step!r} holds a {type(value).__name__} for key {key!r}, which the lmdb state "
                    f"backend cannot serialise: {type(exc).__name__}: {exc}") from exc
            puts.append((encoded, raw))
        try:
            with self.backend.env.begin(write=True, db=self._db) as txn:
                for encoded, raw in puts:
                    if raw is None:
                        txn.delete(encoded)
                    else:
                        txn.put(encoded, raw)
                self._stored = txn.stat(self._db)["entries"]
        except Exception as exc:
            raise self.backend.failed(f"writing the state of step {self.step!r}", exc) from exc
        self._pending.clear()
        self.backend.committed()
