"""State backends: where a task's keyed state lives between checkpoints.

``memory`` (the default) keeps each step's entries in a dict: the fastest hot path, and
all state in the executor's heap. ``rocksdb`` keeps them in RocksDB (through
``rocksdict``), one database per step under the task's scratch directory (the worker's
work directory for an executor), so state can outgrow the heap; the task's files are
removed when it stops. Both hand the operators a mapping, and both snapshot into the same
format (see keygroups.py), so a checkpoint or savepoint taken with one restores with the
other.

Why RocksDB rather than LMDB: ``bench/state_backends.py`` runs the same read-modify-write
loop on both stores. On this machine they went about as fast (84K to 114K records/s, over
2,000,000 and 10,000,000 keys, neither ahead in every run), but RocksDB held the state in
a third to a fifth of the disk (it compresses, LMDB pages do not) and its memory is
bounded by its block cache and memtables, while every LMDB page a task touches counts in
its resident memory (a memory map; 410 MB against RocksDB's 303 MB at 10,000,000 keys):
what decides for state larger than memory.

The table writes back: entries written, removed, or read as values that can change in
place (user code may update a state object without assigning it) wait in a dict until
:meth:`RocksDBTable.settle` finds more than ``flush_entries`` of them, between batches, and
are then written in one write batch (no write-ahead log: a failure restores from the last
checkpoint, never from these files). A read reads that dict first, so hot keys cost a dict
lookup.
"""

from __future__ import annotations

import functools
import io
import itertools
import os
import pickle
import shutil
import tempfile
from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

from gearbus.api.partitioners import MAX_PARALLELISM, stable_hash
from gearbus.control.config import BACKENDS
from gearbus.runtime import local_copies
from gearbus.runtime.keygroups import IMMUTABLE_TYPES, UnserialisableState, estimated_bytes

#: Entries a table holds in memory before :meth:`RocksDBTable.settle` writes them out.
FLUSH_ENTRIES = 16384
#: Entries waiting past which reading a scope to change it writes them out first.
SCAN_WAITING = 1024
#: The block cache the steps of a task share, and each step's memtable.
BLOCK_CACHE_BYTES = 64 << 20
WRITE_BUFFER_BYTES = 32 << 20
#: Entries copied from another task's local copy per write batch.
COPY_BATCH = 65536
#: The databases a table taking local copies keeps at most (one per copy whose key groups
#: it took, cloned; the groups of any further copies are copied into the first): each has
#: a memtable of its own.
MAX_PARTS = 4

_REMOVED = object()
_pickled = functools.partial(pickle.dumps, protocol=pickle.HIGHEST_PROTOCOL)
_MISSING = object()
#: Each key group's first two bytes of a stored key, then the end of the last group's range.
_GROUP_PREFIXES = tuple(group.to_bytes(2, "big") for group in range(MAX_PARALLELISM + 1))
_END_OF_GROUPS = _GROUP_PREFIXES[MAX_PARALLELISM]


class StateBackendError(OSError):
    """The backend cannot read or write its files (disk full, directory unwritable): an
    OSError, so the app rolls back to its last checkpoint, with this as the reason."""


class MemoryBackend:
    """Each step's entries in a dict."""

    name = "memory"

    def table(self, step: str, codec=None, copied: bool = False) -> dict:
        """A dict: the hot path costs what it always did (a dict subclass's lookups cost a
        quarter more)."""
        return {}

    def keep_copy(self, checkpoint_id: int) -> tuple[str, ...]:
        """No local copy: the state is in the heap."""
        return ()

    def completed(self, checkpoint_id: int) -> None:
        """No copies to prune."""

    def offer(self, locators: tuple[str, ...]) -> None:
        """Copies are for tables on disk."""

    def close(self) -> None:
        """Nothing to remove."""


class RocksDBBackend:
    """A directory per task under ``root`` (made when the first table opens, removed by
    :meth:`close`), a RocksDB database per step in it, one block cache for them all.

    With a ``root`` and the key groups the task ``owned``, each checkpoint's snapshot
    also keeps a local copy of the tables stored by key group (:meth:`keep_copy`), and a
    restore takes what the copies offered hold (:meth:`offer`, RocksDBTable.adopt): see
    gearbus/runtime/local_copies.py."""

    name = "rocksdb"

    def __init__(self, root: str | None, label: str, flush_entries: int = FLUSH_ENTRIES, owned: range | None = None):
        self.root = root
        self.label = label
        self.flush_entries = flush_entries
        self.owned = owned
        self.directory: str | None = None
        self.tables: list[RocksDBTable] = []
        self._cache = None
        self._offered: tuple[str, ...] = ()
        self._found: list[local_copies.Copy] | None = None  # the offered copies on this host, once read
        self._kept: list[str] = []  # the paths of this task's copies, oldest first
        #: the key groups the tables took from local copies as they restored, by step
        self.adopted: dict[str, int] = {}

    def table(self, step: str, codec: type[Keys] | None = None, copied: bool = False) -> RocksDBTable:
        """Step ``step``'s table, its keys stored as ``codec`` says (by key group by default);
        ``copied``: kept in the local copies, and taken from them on restore (RocksDBTable.adopt),
        for a step whose restore needs nothing else of each entry (stored by key group)."""
        import rocksdict  # here, not at import: only processes holding state on disk load RocksDB

        try:
            if self.directory is None:
                if self.root is not None:
                    os.makedirs(self.root, exist_ok=True)
                self.directory = tempfile.mkdtemp(prefix=f"{self.label}-", dir=self.root)
                self._cache = rocksdict.Cache(BLOCK_CACHE_BYTES)
            path = os.path.join(self.directory, f"step{len(self.tables)}")
            db = self.open_db(path)
        except Exception as exc:
            raise StateBackendError(f"the rocksdb state backend cannot open its files under "
                                    f"{self.directory or self.root or tempfile.gettempdir()}: "
                                    f"{type(exc).__name__}: {exc}") from exc
        table = RocksDBTable(self, step, db, codec or Keys, path, copied)
        self.tables.append(table)
        return table

    def open_db(self, path: str, read_only: bool = False):
        """The database at ``path`` (made if missing), written without a write-ahead log."""
        import rocksdict

        if read_only:
            return rocksdict.Rdict(path, self._options(), access_type=rocksdict.AccessType.read_only())
        db = rocksdict.Rdict(path, self._options())
        no_wal = rocksdict.WriteOptions()
        no_wal.disable_wal = True  # a failure restores from a checkpoint, never from these files
        db.set_write_options(no_wal)
        return db

    def keep_copy(self, checkpoint_id: int) -> tuple[str, ...]:
        """Keep a local copy of the tables stored by key group as they are at checkpoint
        ``checkpoint_id``'s barrier; its locator (none without a root, or when the copy
        cannot be made: restores then read the store, as without copies). The task's copies
        past :data:`local_copies.COPIES_KEPT` are removed, oldest first."""
        tables = [table for table in self.tables if table.copied]
        if self.root is None or self.owned is None or not tables:
            return ()
        for table in tables:
            table.flush()
        try:
            locator = local_copies.keep(self.root, self.label, checkpoint_id, self.owned,
                                        [(table.step, [db for db, _ in table.parts], table.part_index,
                                          table.group_counts) for table in tables])
        except Exception:  # noqa: BLE001 - a copy only speeds a restore up
            return ()
        self._kept.append(local_copies.path_of(locator))
        while len(self._kept) > local_copies.COPIES_KEPT:
            shutil.rmtree(self._kept.pop(0), ignore_errors=True)
        return (locator,)

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: the copies of older ones (any task's
        under the root) are removed."""
        local_copies.prune(self.root, checkpoint_id)
        self._kept = [path for path in self._kept if os.path.isdir(path)]

    def offer(self, locators: tuple[str, ...]) -> None:
        """The local copies the restore that follows may take state from."""
        self._offered, self._found = locators, None

    def copies_of(self, step: str) -> list[tuple[local_copies.Copy, range]]:
        """The offered copies on this host holding some of the task's key groups of
        ``step``, with those groups (their manifests read once per restore)."""
        if not self._offered or self.owned is None:
            return []
        if self._found is None:
            self._found = local_copies.found(self._offered)
        return [(copy, overlap) for copy in self._found if step in copy.tables and (overlap := copy.overlap(self.owned))]

    def _options(self):
        import rocksdict

        options = rocksdict.Options(raw_mode=True)
        options.create_if_missing(True)
        options.set_write_buffer_size(WRITE_BUFFER_BYTES)
        options.set_memtable_whole_key_filtering(True)  # most reads of new keys miss: a bloom
        options.set_memtable_prefix_bloom_ratio(0.1)     # filter answers them without a search
        blocks = rocksdict.BlockBasedOptions()
        blocks.set_bloom_filter(10, False)
        blocks.set_block_cache(self._cache)
        options.set_block_based_table_factory(blocks)
        return options

    def failed(self, doing: str, exc: Exception) -> StateBackendError:
        return StateBackendError(f"the rocksdb state backend at {self.directory} failed {doing}: "
                                 f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Close every step's database and remove the task's files (not its local copies:
        the next epoch's tasks may take them)."""
        for table in self.tables:
            table.close()
        self.tables.clear()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None


def settle_of(table) -> Callable[[], None]:
    """What writes a table's waiting entries out between batches (nothing for a dict)."""
    return getattr(table, "settle", nothing)


def nothing(*_) -> None:
    """A dict's settle (and any step's for what it holds in memory): nothing waits."""


def held_bytes(tables, values: Callable[[], Iterator], count: int) -> int:
    """The estimated bytes ``count`` entries of ``tables`` (one step's) hold: tables on
    disk measure themselves; dicts are estimated from a sample of ``values()``."""
    if not count:
        return 0
    if isinstance(tables[0], dict):
        return estimated_bytes(values(), count)
    return sum(table.size()[1] for table in tables)


def open_backend(name: str, root: str | None, label: str, owned: range | None = None):
    """A task's backend: ``root`` is the directory its files go under (None: the system's
    temporary directory, and no local copies), ``label`` names its own directory there,
    ``owned`` the key groups the task owns (None: no local copies)."""
    if name == "memory":
        return MemoryBackend()
    if name == "rocksdb":
        return RocksDBBackend(root, label, owned=owned)
    raise ValueError(f"unknown state backend {name!r} (one of {', '.join(BACKENDS)})")


def encode_key(key) -> bytes:
    """``key`` as the store holds it: its key group (so a group's entries are one range),
    then its body (:func:`_body`): keys a dict holds as one encode alike."""
    kind = type(key)
    if kind is bool or kind is float and key.is_integer():
        key = int(key)  # its key group too
    return _GROUP_PREFIXES[stable_hash(key) % MAX_PARALLELISM] + _body(key)


def _body(key) -> bytes:
    """A key's type and bytes. Numbers a dict holds as one key (``True``, ``1``, ``1.0``)
    as an int; tuples and frozensets element by element (a frozenset's in sorted order),
    so equal ones encode alike whatever numbers they hold or the order they were built
    in; any other key pickled without memo."""
    kind = type(key)
    if kind is str:
        return b"s" + key.encode("utf-8", "surrogatepass")
    if kind is bool or kind is float and key.is_integer():
        key, kind = int(key), int
    if kind is int:
        return b"i" + str(key).encode()
    if kind is bytes:
        return b"b" + key
    if kind is tuple or kind is frozenset:
        parts = [_body(item) for item in key]
        if kind is frozenset:
            parts.sort()
        return (b"t" if kind is tuple else b"f") + b"".join(len(part).to_bytes(4, "big") + part for part in parts)
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, pickle.HIGHEST_PROTOCOL)
    pickler.fast = True
    pickler.dump(key)
    return b"p" + buffer.getvalue()


def decode_key(encoded: bytes) -> Any:
    """The inverse of :func:`encode_key` (up to equality: see :func:`exact_key`)."""
    return _parsed(memoryview(encoded)[2:])


def _parsed(body: memoryview) -> Any:
    kind = body[:1].tobytes()
    if kind == b"s":
        return str(body[1:], "utf-8", "surrogatepass")
    if kind == b"i":
        return int(body[1:])
    if kind == b"b":
        return body[1:].tobytes()
    if kind in (b"t", b"f"):
        items, at = [], 1
        while at < len(body):
            size = int.from_bytes(body[at:at + 4], "big")
            items.append(_parsed(body[at + 4:at + 4 + size]))
            at += 4 + size
        return tuple(items) if kind == b"t" else frozenset(items)
    return pickle.loads(body[1:])


def exact_key(key) -> bool:
    """Whether ``key`` decodes as itself, not only as an equal key: not when it holds a
    bool or a float (they decode as the int they equal, or as a float)."""
    kind = type(key)
    if kind is str or kind is int or kind is bytes:
        return True
    if kind is tuple or kind is frozenset:
        return all(map(exact_key, key))
    return kind is not bool and kind is not float


def _itself(value):
    return value


class _KeyAndValue(tuple):
    """A stored value whose key does not decode as itself (see :func:`exact_key`): the
    key as written, then the value."""

    __slots__ = ()


class Keys:
    """How a table stores its keys: by key group (:func:`encode_key`). A codec whose keys
    are pairs (scope, key) also says how a scope's keys begin (``prefix``), so that one
    scope's entries are read and removed as one range."""

    encode = staticmethod(encode_key)
    decode = staticmethod(decode_key)
    #: the range every stored key lies in
    span = (_GROUP_PREFIXES[0], _END_OF_GROUPS)

    #: whether a key decodes as itself; an entry whose key does not keeps it beside its value
    exact = staticmethod(exact_key)
    #: a value as pickled, and back (the value itself)
    pack = unpack = staticmethod(_itself)

    @staticmethod
    def prefix(scope) -> bytes:
        raise TypeError("keys stored by key group have no scopes")


def _after(prefix: bytes) -> bytes:
    """The first key past every key that starts with ``prefix``."""
    stripped = prefix.rstrip(b"\xff")
    if not stripped:
        return b"\xff" * (len(prefix) + 1)
    return stripped[:-1] + bytes([stripped[-1] + 1])


class RocksDBTable(MutableMapping):
    """One step's entries in its RocksDB database, written back (see the module
    docstring). ``len`` is exact after :meth:`flush`: a write-out looks up whether the keys
    it writes were stored, unless a read already told (a scope removed with
    :meth:`remove_scope` is not counted out: a table of scopes counts by scope).

    A table that took the key groups of several local copies (:meth:`take_copies`) keeps
    up to MAX_PARTS databases, each holding some key groups (``part_index``); its keys go
    to their group's."""

    def __init__(self, backend: RocksDBBackend, step: str, db, codec: type[Keys] = Keys, path: str | None = None,
                 copied: bool = False):
        self.backend = backend
        self.step = step
        self.path = path
        #: the databases (and their directories), and which one holds each key group
        self.parts: list[tuple[Any, str | None]] = [(db, path)]
        self.part_index = [0] * MAX_PARALLELISM
        self._db = db  # the database, when there is one (else None: each key's group's, _part_of)
        self._part_of: list | None = None
        self.codec = codec
        #: the keys stored in each key group, kept for a table stored by key group (what a
        #: local copy's manifest records, so that a restore taking it counts without a pass)
        self.group_counts: list[int] | None = [0] * MAX_PARALLELISM if codec is Keys else None
        #: kept in the task's local copies and taken from them (see RocksDBBackend.table)
        self.copied = copied and codec is Keys
        self._encode = codec.encode
        self._pending: dict[Any, Any] = {}  # key -> value, or _REMOVED
        #: keys read since the last write-out: (encoded, whether stored)
        self._read: dict[Any, tuple[bytes, bool]] = {}
        self._count = 0  # entries stored

    def get(self, key, default=None):
        value = self._pending.get(key, _MISSING)
        if value is _MISSING:
            encoded = self._encode(key)
            raw = self._stored(encoded)
            self._read[key] = (encoded, raw is not None)  # most keys read are written next
            if raw is None:
                return default
            value = self._value(raw)
            if type(value) not in IMMUTABLE_TYPES:
                self._pending[key] = value  # user code may change it in place
            return value
        return default if value is _REMOVED else value

    def prefetch(self, keys) -> None:
        """Read the keys not waiting in one multi-get, and keep what they hold waiting
        (a key that holds nothing as removed, which writes nothing): a batch's reads then
        cost a dict lookup each instead of a RocksDB read."""
        pending = self._pending
        wanted = [key for key in dict.fromkeys(keys) if key not in pending]
        if not wanted:
            return
        encoded = list(map(self._encode, wanted))
        try:
            stored = self._db.get(encoded) if self._db is not None else self._parts_get(encoded)
        except Exception as exc:
            raise self.backend.failed(f"reading the state of step {self.step!r}", exc) from exc
        read = self._read
        for key, encoding, raw in zip(wanted, encoded, stored):
            read[key] = (encoding, raw is not None)
            if raw is None:
                pending[key] = _REMOVED
            else:
                pending[key] = self._value(raw)

    def _parts_get(self, encoded: list[bytes]) -> list[bytes | None]:
        """A multi-get over the table's databases: each key read from its group's."""
        by_part: dict[int, list[int]] = {}
        for at, key in enumerate(encoded):
            by_part.setdefault(self.part_index[key[0] << 8 | key[1]], []).append(at)
        stored: list[bytes | None] = [None] * len(encoded)
        for part, places in by_part.items():
            for at, raw in zip(places, self.parts[part][0].get([encoded[at] for at in places])):
                stored[at] = raw
        return stored

    def peek(self, key, default=None):
        """:meth:`get` for a snapshot: what it reads from the store is not kept in memory
        (the snapshot copies a value that can change)."""
        value = self._pending.get(key, _MISSING)
        if value is _MISSING:
            raw = self._stored(self._encode(key))
            if raw is None:
                return default
            return self._value(raw)
        return default if value is _REMOVED else value

    def _value(self, raw: bytes):
        """A value as stored (pickled, packed by the codec) back as it was written."""
        stored = pickle.loads(raw)
        return self.codec.unpack(stored[1] if type(stored) is _KeyAndValue else stored)

    def _entry(self, key, raw: bytes) -> tuple[Any, Any]:
        """(key, value) of a stored value read under ``key`` as decoded: the key as
        written when the entry keeps it."""
        stored = pickle.loads(raw)
        if type(stored) is _KeyAndValue:
            key, stored = stored
        return key, self.codec.unpack(stored)

    def _stored(self, encoded: bytes) -> bytes | None:
        """The stored value of a key (encoded), pickled; None when it holds none."""
        try:
            db = self._db if self._db is not None else self._part_of[encoded[0] << 8 | encoded[1]]
            return db.get(encoded)
        except Exception as exc:
            raise self.backend.failed(f"reading the state of step {self.step!r}", exc) from exc

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
        """The stored entries plus every one waiting: exact after a write-out, an upper
        bound between."""
        return self._count + len(self._pending)

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
        try:
            decode = self.codec.decode
            for encoded, raw in itertools.chain.from_iterable(db.items() for db, _ in self.parts):
                key = decode(encoded)
                if key not in waiting:
                    yield self._entry(key, raw)
        except StateBackendError:
            raise
        except Exception as exc:
            raise self.backend.failed(f"reading the state of step {self.step!r}", exc) from exc

    def scope_items(self, scope, keep: bool) -> Iterator[tuple[Any, Any]]:
        """The entries of one scope (keys ``(scope, key)``): those waiting, then the stored
        ones by key. ``keep`` keeps each value read that can change in place waiting, as
        :meth:`get` does (the caller may change it), and first writes out what waits when
        much does (so that scopes read one after another do not each pass over it);
        without it nothing read is kept, nor written."""
        if keep and len(self._pending) > SCAN_WAITING:
            self.flush()
        waiting = {key: value for key, value in self._pending.items() if key[0] == scope}
        for key, value in waiting.items():
            if value is not _REMOVED:
                yield key, value
        prefix, decode, pending, read = self.codec.prefix(scope), self.codec.decode, self._pending, self._read
        try:
            for encoded, raw in self._db.items(from_key=prefix):
                if not encoded.startswith(prefix):
                    break
                key = decode(encoded)
                if key in waiting:
                    continue
                key, value = self._entry(key, raw)
                if keep and type(value) not in IMMUTABLE_TYPES:
                    pending[key] = value
                    read[key] = (encoded, True)
                yield key, value
        except StateBackendError:
            raise
        except Exception as exc:
            raise self.backend.failed(f"reading the state of step {self.step!r}", exc) from exc

    def remove_scope(self, scope) -> None:
        """Remove every entry of one scope: one range on disk."""
        self._pending = {key: value for key, value in self._pending.items() if key[0] != scope}
        self._read = {key: value for key, value in self._read.items() if key[0] != scope}
        prefix = self.codec.prefix(scope)
        try:
            self._db.delete_range(prefix, _after(prefix))
        except Exception as exc:
            raise self.backend.failed(f"removing the state of step {self.step!r}", exc) from exc

    def size(self) -> tuple[int, int]:
        """(keys, bytes) for the metrics, without writing anything out: RocksDB's estimate
        of its live data and its memtables, and the pickled size of the entries waiting,
        estimated. Nothing once the task closed its backend (the metrics may still ask)."""
        if not self.parts:
            return 0, 0
        try:
            stored = sum(db.property_int_value(name) or 0 for db, _ in self.parts
                         for name in ("rocksdb.estimate-live-data-size", "rocksdb.cur-size-all-mem-tables"))
        except Exception as exc:
            raise self.backend.failed(f"reading the size of step {self.step!r}", exc) from exc
        return len(self), stored + estimated_bytes(iter(self._pending.items()), len(self._pending))

    def clear(self) -> None:
        self._pending.clear()
        self._read.clear()
        try:
            for db, _ in self.parts:
                db.delete_range(*self.codec.span)
        except Exception as exc:
            raise self.backend.failed(f"clearing the state of step {self.step!r}", exc) from exc
        self._count = 0
        if self.group_counts is not None:
            self.group_counts = [0] * MAX_PARALLELISM

    def settle(self) -> None:
        """Between batches: write the waiting entries out once there are many (or many
        keys were read)."""
        limit = self.backend.flush_entries
        if len(self._pending) > limit or len(self._read) > limit:
            self.flush()

    def flush(self) -> None:
        """Write every waiting entry in one write batch. A value pickle refuses fails the
        step, naming it, the key and the type; a failing disk raises StateBackendError."""
        read, self._read = self._read, {}
        if not self._pending:
            return
        import rocksdict

        batch, stored, raw = rocksdict.WriteBatch(raw_mode=True), self._count, self._raw
        counts = self.group_counts[:] if self.group_counts is not None else None  # kept if the write fails
        batches = [batch] + [rocksdict.WriteBatch(raw_mode=True) for _ in self.parts[1:]]
        index = self.part_index if len(batches) > 1 else None
        try:
            for key, value in self._pending.items():
                encoded, was_stored = read.get(key) or self._lookup(key)
                if index is not None:
                    batch = batches[index[encoded[0] << 8 | encoded[1]]]
                if value is _REMOVED:
                    if was_stored:
                        batch.delete(encoded)
                        stored -= 1
                        if counts is not None:
                            counts[encoded[0] << 8 | encoded[1]] -= 1
                    continue
                batch.put(encoded, raw(key, value))
                if not was_stored:
                    stored += 1
                    if counts is not None:
                        counts[encoded[0] << 8 | encoded[1]] += 1
            for (db, _), written in zip(self.parts, batches):
                db.write(written)
        except (UnserialisableState, StateBackendError):
            raise
        except Exception as exc:
            raise self.backend.failed(f"writing the state of step {self.step!r}", exc) from exc
        self._pending.clear()
        self._count = stored
        if counts is not None:
            self.group_counts = counts

    def load(self, group: int, keys: list, values: list) -> None:
        """Put back key group ``group``'s entries into a table that holds none of its keys
        (a restore, after :meth:`clear`): written at once, without the lookup a write-out
        makes to count them, and keys that decode as themselves encoded without hashing
        them again (a third of a restore's time into RocksDB went to both)."""
        if self.codec is not Keys:
            self.update(zip(keys, values))
            return
        import rocksdict

        batch, prefix = rocksdict.WriteBatch(raw_mode=True), _GROUP_PREFIXES[group]
        strings, ints, put = prefix + b"s", prefix + b"i", batch.put
        try:
            try:
                pickled = list(map(_pickled, values))  # (the codec keeps values as they are)
            except Exception:
                for key, value in zip(keys, values):
                    self._raw(key, value)  # names the entry pickle refuses
                raise
            for key, value, raw in zip(keys, values, pickled):
                kind = type(key)
                if kind is str:  # most keys: encoded as _body does, without a call
                    put(strings + key.encode("utf-8", "surrogatepass"), raw)
                elif kind is int:
                    put(ints + str(key).encode(), raw)
                elif exact_key(key):
                    put(prefix + _body(key), raw)
                else:
                    put(encode_key(key), self._raw(key, value))
            self.parts[self.part_index[group]][0].write(batch)
        except (UnserialisableState, StateBackendError):
            raise
        except Exception as exc:
            raise self.backend.failed(f"writing the state of step {self.step!r}", exc) from exc
        self._count += len(keys)
        self.group_counts[group] += len(keys)

    def _raw(self, key, value) -> bytes:
        """A value as stored (beside its key when the key does not decode as itself); one
        pickle refuses fails the step, naming it, the key and the type."""
        try:
            packed = self.codec.pack(value)
            return pickle.dumps(packed if self.codec.exact(key) else _KeyAndValue((key, packed)),
                                pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            raise UnserialisableState(
                f"step {self.step!r} holds a {type(value).__name__} for key {key!r}, which the rocksdb "
                f"state backend cannot serialise: {type(exc).__name__}: {exc}") from exc

    def _lookup(self, key) -> tuple[bytes, bool]:
        """A key written without being read first: its encoding, and whether it is stored."""
        encoded = self._encode(key)
        return encoded, self._stored(encoded) is not None

    def adopt(self) -> frozenset[int]:
        """Fill the table (empty) with what the local copies offered to the task hold of
        its key groups (:meth:`take_copies`); the groups it now holds (the restore loads
        the others). Copies that cannot be taken leave it empty, as if none were offered."""
        copies = self.backend.copies_of(self.step) if self.copied else []
        if not copies:
            return frozenset()
        try:
            groups = self.take_copies(copies)
        except Exception:  # noqa: BLE001 - loaded from the store instead
            self.reopen()
            return frozenset()
        self.backend.adopted[self.step] = len(groups)
        return groups

    def take_copies(self, copies: list) -> frozenset[int]:
        """Take the key groups ``copies`` hold for the task ((local_copies.Copy, the groups
        it owns that the copy's task owned)): each of the copies' databases holding some is
        cloned (hard links) less every other group, for the MAX_PARTS holding most keys;
        the groups of any others are copied into the first, raw, as stored. The groups
        taken; nothing may wait."""
        pieces: dict[str, tuple[list[int], list[int]]] = {}  # database -> (its groups taken, its copy's counts)
        for copy, groups in copies:
            directories, index, counts = copy.tables[self.step]
            for group in groups:
                pieces.setdefault(os.path.join(copy.path, directories[index[group]]), ([], counts))[0].append(group)
        ranked = sorted(pieces.items(), key=lambda piece: -sum(map(piece[1][1].__getitem__, piece[1][0])))
        self._remove_parts()
        parts, part_index, group_counts = [], [0] * MAX_PARALLELISM, [0] * MAX_PARALLELISM
        try:
            for number, (source, (groups, counts)) in enumerate(ranked[:MAX_PARTS]):
                path = self._part_path(number)
                local_copies.clone(source, path)
                parts.append((self.backend.open_db(path), path))
                for start, stop in local_copies.runs(sorted(set(range(MAX_PARALLELISM)).difference(groups))):
                    parts[-1][0].delete_range(_GROUP_PREFIXES[start], _GROUP_PREFIXES[stop])
                for group in groups:
                    part_index[group], group_counts[group] = number, counts[group]
        except BaseException:
            for db, _ in parts:
                db.close()
            raise
        self._set_parts(parts, part_index)
        for source, (groups, counts) in ranked[MAX_PARTS:]:
            for start, stop in local_copies.runs(groups):
                self._copy_entries(source, range(start, stop))
            for group in groups:
                group_counts[group] = counts[group]
        self.group_counts, self._count = group_counts, sum(group_counts)
        return frozenset(group for groups, _ in pieces.values() for group in groups)

    def _copy_entries(self, path: str, groups: range) -> None:
        """Write the entries of ``groups`` the database at ``path`` holds, as stored, into
        the database holding the first of them."""
        import rocksdict

        source, end = self.backend.open_db(path, read_only=True), _GROUP_PREFIXES[groups.stop]
        target = self.parts[self.part_index[groups.start]][0]
        try:
            batch, count = rocksdict.WriteBatch(raw_mode=True), 0
            for key, value in source.items(from_key=_GROUP_PREFIXES[groups.start]):
                if key >= end:
                    break
                batch.put(key, value)
                count += 1
                if count % COPY_BATCH == 0:
                    target.write(batch)
                    batch = rocksdict.WriteBatch(raw_mode=True)
            target.write(batch)
        finally:
            source.close()

    def reopen(self) -> None:
        """The table empty, in one new database (a restore that could not take the copies
        offered loads the store's instead)."""
        self._remove_parts()
        self._set_parts([(self.backend.open_db(self.path), self.path)], [0] * MAX_PARALLELISM)
        self._count = 0
        self.group_counts = [0] * MAX_PARALLELISM

    def _part_path(self, number: int) -> str:
        return self.path if number == 0 else f"{self.path}.{number}"

    def _set_parts(self, parts: list[tuple[Any, str]], part_index: list[int]) -> None:
        self.parts, self.part_index = parts, part_index
        self._db = parts[0][0] if len(parts) == 1 else None
        self._part_of = None if len(parts) == 1 else [parts[number][0] for number in part_index]

    def _remove_parts(self) -> None:
        """Close the databases and remove their files, nothing waiting."""
        self._pending.clear()
        self._read.clear()
        self.close()
        for number in range(MAX_PARTS):
            shutil.rmtree(self._part_path(number), ignore_errors=True)

    def close(self) -> None:
        """Close the databases, whose files are about to be removed: what closing one fails
        on (a full disk as it writes its memtable out) loses nothing."""
        parts, self.parts, self._db, self._part_of = self.parts, [], None, None
        for db, _ in parts:
            try:
                db.close()
            except Exception:  # noqa: BLE001 - see above
                pass
