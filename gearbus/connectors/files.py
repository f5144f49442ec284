"""File and collection connectors: a text file read line by line, an in-memory
collection, and a JSON Lines sink. The sources replay from a checkpoint's position;
the sink commits in two phases, so its files hold each result exactly once."""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import threading
from collections.abc import Callable, Iterable
from contextlib import contextmanager
from typing import Any

from gearbus.api.paths import submitter_path
from gearbus.api.task import DataSink, DataSource, Record, TaskContext, new_record, now_ms

READ_CHUNK_BYTES = 1 << 20
#: The fence file's fixed size: rewritten in place, it never keeps a longer old tail.
_FENCE_BYTES = 64

log = logging.getLogger(__name__)


def unusable(exc: OSError, doing: str, path: str, step: str, context: TaskContext) -> OSError:
    """``exc``, met opening ``path``, as an error of its own kind that names the step, the
    path and the worker: the user sees what to fix, and where. Its ``errno`` stays, so a
    failing disk (gearbus/runtime/failures.py) is still told from a missing file."""
    where = f" on {context.worker}" if context.worker else ""
    error = type(exc)(f"step {step!r} cannot {doing} {path}{where}: {exc.strerror or exc}")
    error.errno = exc.errno  # (not strerror: str() stays the message above)
    return error


class TextFileSource(DataSource):
    """Reads a UTF-8 text file as one record per line (without the ``\\n``).

    With parallelism N the file is cut into N byte ranges; a task owns the lines that
    start inside its range (as Hadoop's input splits do), so every line is read once.

    Replayable: a snapshot is the byte offset of the next line to hand out, and a task
    restored from it reads exactly the rest of its split (the file must not change;
    without ``timestamp_fn`` the replayed lines get new ingestion times). A rescale cuts
    what is left of the old tasks' splits into as many byte ranges as new tasks
    (:meth:`rescale`), by the same rule: a task may then read several ranges, one after
    the other.

    A relative ``path`` is in the submitter's directory (gearbus/api/paths.py).
    """

    replayable = True

    def __init__(self, path: str | os.PathLike, timestamp_fn: Callable[[str], int] | None = None):
        self.path = submitter_path(path)
        self.timestamp_fn = timestamp_fn

    @property
    def event_time(self) -> bool:
        return self.timestamp_fn is not None

    def open(self, context: TaskContext) -> None:
        try:
            self._file = open(self.path, "rb")
        except OSError as exc:
            raise unusable(exc, "read", self.path, (context.config.get("steps") or [context.processor_name])[0],
                           context) from None
        self._size = size = os.fstat(self._file.fileno()).st_size
        n, i = context.parallelism, context.index
        self._split_start = start = size * i // n
        self._end = size * (i + 1) // n
        if start > 0:
            self._file.seek(start - 1)
            start = start - 1 + len(self._file.readline())  # skip the line owned by task i-1
        self._first = start
        self._ranges: list[list[int]] = []  # byte ranges to read after this one (a rescale's)
        self._seek(start)

    def _seek(self, offset: int) -> None:
        """Continue reading with the line that starts at ``offset``."""
        self._file.seek(offset)
        self._buffer_start = offset
        self._carry = b""
        self._done = offset >= self._end
        self._pending: list[Record] = []
        self._taken = 0
        # The bytes behind _pending and where they start, to find a snapshot's offset.
        self._chunk = b""
        self._chunk_start = offset

    def read(self, max_records: int) -> list[Record] | None:
        """At most ``max_records`` records, so batch boundaries (and with them the
        watermark's steps) are the same on every runner."""
        while self._taken >= len(self._pending):
            chunk = self._next_chunk()
            if chunk is None:
                if not self._ranges:
                    return None
                self._begin(*self._ranges.pop(0))
                continue
            self._pending, self._taken = chunk, 0
        batch = self._pending[self._taken : self._taken + max_records]
        self._taken += len(batch)
        return batch

    def _next_chunk(self) -> list[Record] | None:
        while not self._done:
            chunk = self._file.read(READ_CHUNK_BYTES)
            owned_start = self._buffer_start
            owned = self._take_owned(self._carry + chunk, eof=not chunk)
            if owned:
                records = self._to_records(owned, owned_start)
                self._chunk, self._chunk_start = owned, owned_start
                return records
        return None

    def _take_owned(self, buffer: bytes, eof: bool) -> bytes:
        """Return the complete lines of ``buffer`` this task owns; keep the rest."""
        limit = self._end - self._buffer_start
        if limit <= len(buffer):
            newline = buffer.find(b"\n", max(limit - 1, 0))
            if newline == -1 and not eof:
                self._carry = buffer
                return b""
            self._done = True
            return buffer if newline == -1 else buffer[: newline + 1]
        if eof:
            self._done = True
            return buffer
        last = buffer.rfind(b"\n")
        if last == -1:
            self._carry = buffer
            return b""
        self._carry = buffer[last + 1 :]
        self._buffer_start += last + 1
        return buffer[: last + 1]

    def _to_records(self, owned: bytes, owned_start: int) -> list[Record]:
        try:
            text = owned.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"{self.path}: not valid UTF-8 near byte {owned_start + exc.start}") from None
        lines = text.split("\n")
        if text.endswith("\n"):
            lines.pop()
        values = self._parse(lines, owned_start)
        if self.timestamp_fn is not None:
            fn = self.timestamp_fn
            return [new_record(Record, (v, fn(v), None)) for v in values]
        ts = now_ms()
        return [new_record(Record, (v, ts, None)) for v in values]

    def _parse(self, lines: list[str], owned_start: int) -> list:
        """Turn lines into values: the lines themselves for a text file."""
        return lines

    def _lines_holding(self, lines: list[bytes], values: int) -> int:
        """How many of ``lines`` (from the start) hold the first ``values`` values."""
        return values

    def snapshot(self) -> dict:
        """The byte offset of the first line read() has not handed out, with the file's
        size and the split's byte range, which :meth:`restore` checks (after a rescale:
        the byte ranges still to read, from that offset on)."""
        if self._split_start is None:
            return {"path": self.path, "size": self._size, "ranges": [[self._offset(), self._end], *self._ranges]}
        return {"path": self.path, "size": self._size, "start": self._split_start, "end": self._end,
                "offset": self._offset()}

    def rescale(self, states: list, index: int, parallelism: int) -> dict | None:
        """Task ``index`` of ``parallelism``'s byte ranges to read: what is left of the old
        tasks' (in task order) as one span of bytes, cut in ``parallelism`` equal parts; a
        task owns the lines that start in its part, as with splits."""
        states = [state for state in states if state is not None]
        if not states:
            return None
        left = [(offset, end) for state in states
                for offset, end in (state["ranges"] if "ranges" in state else [[state["offset"], state["end"]]])
                if offset < end]
        total = sum(end - offset for offset, end in left)
        low, high = total * index // parallelism, total * (index + 1) // parallelism
        mine, passed = [], 0
        for offset, end in left:
            start, stop = max(offset, offset + low - passed), min(end, offset + high - passed)
            if start < stop:
                mine.append([start, stop])
            passed += end - offset
        return {"path": states[0]["path"], "size": states[0]["size"], "ranges": mine}

    def _offset(self) -> int:
        """Worked out from the current chunk's bytes only when asked, so that read()
        costs nothing more."""
        chunk, taken = self._chunk, self._taken
        if taken >= len(self._pending):
            return self._chunk_start + len(chunk)
        lines = chunk.split(b"\n")
        used = self._lines_holding(lines, taken)
        return self._chunk_start + sum(map(len, lines[:used])) + used

    def restore(self, state: dict) -> None:
        """Continue at the snapshot's offset: read() gives exactly the split's lines that
        the snapshotted task had not handed out yet (or its byte ranges, after a rescale)."""
        if "ranges" in state:
            self._restore_ranges(state)
            return
        mine = {"path": self.path, "size": self._size, "start": self._split_start, "end": self._end}
        theirs = {name: state.get(name) for name in mine}
        if theirs != mine:
            raise ValueError(
                f"{self.path}: cannot resume from a snapshot of another file or split "
                f"(snapshot {theirs}, this task {mine}); was the file changed, or the parallelism?"
            )
        offset = state["offset"]
        if not (offset in (self._first, self._size)
                or self._first < offset < self._size and self._byte_before(offset) == b"\n"):
            raise ValueError(f"{self.path}: snapshot offset {offset} is not the start of a line of this task's split")
        self._seek(offset)

    def _restore_ranges(self, state: dict) -> None:
        if (state["path"], state["size"]) != (self.path, self._size):
            raise ValueError(f"{self.path}: cannot resume from a snapshot of another file (snapshot of "
                             f"{state['path']}, {state['size']} bytes; this one has {self._size}): was it changed?")
        ranges = [list(r) for r in state["ranges"]]
        if not all(0 <= offset <= end <= self._size for offset, end in ranges):
            raise ValueError(f"{self.path}: snapshot ranges {ranges} lie outside its {self._size} bytes")
        self._split_start = None  # ranges, not the task's own split
        self._ranges = ranges
        self._begin(*(ranges.pop(0) if ranges else (self._size, self._size)))

    def _begin(self, offset: int, end: int) -> None:
        """Read the lines that start in bytes ``offset`` to ``end`` (a line that starts
        before ``offset`` is another range's)."""
        self._end = end
        if 0 < offset < end and self._byte_before(offset) != b"\n":
            offset += len(self._file.readline())
        self._seek(offset)

    def _byte_before(self, offset: int) -> bytes:
        self._file.seek(offset - 1)
        return self._file.read(1)

    def line_number(self, byte_offset: int) -> int:
        """The 1-based line number of the line starting at ``byte_offset`` (for errors)."""
        with open(self.path, "rb") as f:
            return f.read(byte_offset).count(b"\n") + 1

    def close(self) -> None:
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None


class JsonLinesSource(TextFileSource):
    """Reads a JSON Lines file: one JSON value per line; blank lines are skipped. A line
    that is not valid JSON fails the source with the file and line number."""

    def _lines_holding(self, lines, values):
        if values == 0:
            return 0
        # Blank as _parse judges them (str.strip knows more whitespace than bytes.strip).
        ends = [used for used, line in enumerate(lines, 1) if line.decode("utf-8").strip()]
        return ends[values - 1]

    def _parse(self, lines, owned_start):
        loads = json.loads
        try:
            return [loads(line) for line in lines if line.strip()]
        except ValueError:
            offset = owned_start
            for line in lines:
                try:
                    if line.strip():
                        loads(line)
                except ValueError as exc:
                    raise ValueError(
                        f"{self.path}:{self.line_number(offset)}: not valid JSON ({exc}): {line[:200]!r}"
                    ) from None
                offset += len(line.encode("utf-8")) + 1
            raise


class CollectionSource(DataSource):
    """Emits the items of a collection; task i of N takes items i, i+N, i+2N, ...
    Replayable: a snapshot is how many of its items the task has read."""

    replayable = True

    def __init__(self, items: Iterable[Any], timestamp_fn: Callable[[Any], int] | None = None):
        self.items = list(items)
        self.timestamp_fn = timestamp_fn

    @property
    def event_time(self) -> bool:
        return self.timestamp_fn is not None

    def open(self, context: TaskContext) -> None:
        self._task = {"index": context.index, "parallelism": context.parallelism, "items": len(self.items)}
        self._mine = self.items[context.index :: context.parallelism]
        self._pos = 0

    def snapshot(self) -> dict:
        """How many of its items the task has read, and which share of which size it reads."""
        return {**self._task, "position": self._pos}

    def restore(self, state: dict) -> None:
        theirs = {name: state.get(name) for name in self._task}
        if theirs != self._task:
            raise ValueError(
                f"CollectionSource: cannot resume from a snapshot of another share (snapshot {theirs}, "
                f"this task {self._task}); was the collection or the parallelism changed?"
            )
        self._pos = state["position"]

    def read(self, max_records: int) -> list[Record] | None:
        if self._pos >= len(self._mine):
            return None
        batch = self._mine[self._pos : self._pos + max_records]
        self._pos += len(batch)
        if self.timestamp_fn is not None:
            return [new_record(Record, (v, self.timestamp_fn(v), None)) for v in batch]
        ts = now_ms()
        return [new_record(Record, (v, ts, None)) for v in batch]


class StaleAttemptError(RuntimeError):
    """A sink's file belongs to a newer attempt of the application (or to another
    application): this attempt was replaced, and must not write."""


class JsonLinesSink(DataSink):
    """Writes each record's value as one JSON line, exactly once (two-phase commit).

    With parallelism 1 the file is ``path``; with more, task i writes
    ``<stem>-<i>.<ext>`` beside it.

    Lines reach the file only when their checkpoint completes: :meth:`write` buffers
    them in memory, :meth:`pre_commit` seals them as the checkpoint's transaction, :meth:`commit`
    appends the sealed transactions and fsyncs. The file's content is its committed
    length; a commit or restore first cuts off anything beyond it (output of a failed
    attempt after its last checkpoint, or, on a fresh start, the previous run's file:
    open() cannot truncate, as it does not know yet whether restore() follows).

    Fencing: the hidden file ``.<name>.fence`` beside it names the attempt that owns the file (application id,
    start time, epoch). open() takes it over unless a newer epoch of the same
    application holds it; commits happen under its lock (flock) and only while this
    attempt owns it, so a replaced (zombie) attempt raises :class:`StaleAttemptError`
    instead of writing.

    A relative ``path`` is in the submitter's directory (gearbus/api/paths.py); a missing
    directory is made. ``step``: the step that writes (set by the DSL), for errors.
    """

    transactional = True

    def __init__(self, path: str | os.PathLike, step: str = ""):
        self.path = submitter_path(path)
        self.step = step

    def open(self, context: TaskContext) -> None:
        path = self.path
        if context.parallelism > 1:
            stem, ext = os.path.splitext(path)
            path = f"{stem}-{context.index:05d}{ext}"
        directory = os.path.dirname(path)
        self._path = path
        self._attempt = (context.app_id, context.app_start_ms, context.epoch)
        self._buffer: list[bytes] = []
        #: (checkpoint id, bytes) of sealed transactions not committed yet, by id.
        self._sealed: list[tuple[int, bytes]] = []
        self._committed = 0
        # commit() may run in another thread than write/pre_commit/snapshot: _lock guards
        # _sealed and _committed, _commit_lock lets one commit run at a time.
        self._lock = threading.Lock()
        self._commit_lock = threading.Lock()
        try:
            os.makedirs(directory, exist_ok=True)
            self._file = open(path, "ab")
        except OSError as exc:
            raise unusable(exc, "write", path, self.step or context.processor_name, context) from None
        self._fence = os.open(os.path.join(directory, f".{os.path.basename(path)}.fence"), os.O_RDWR | os.O_CREAT,
                              0o644)
        with self._fence_locked() as owner:
            if owner is not None and owner[:2] == self._attempt[:2] and owner[2] > self._attempt[2]:
                raise StaleAttemptError(self._refusal(owner))
            if owner != self._attempt:
                os.pwrite(self._fence, " ".join(map(str, self._attempt)).ljust(_FENCE_BYTES - 1).encode() + b"\n", 0)
                os.fsync(self._fence)
        directory_fd = os.open(directory, os.O_RDONLY)  # make new files' names durable too
        try:
            os.fsync(directory_fd)
        finally:
            os.close(directory_fd)

    def write(self, records: list[Record]) -> None:
        """Buffer the batch's lines (encoded now, so bad values fail here)."""
        dumps = json.dumps
        self._buffer.append("".join([dumps(r.value, ensure_ascii=False) + "\n" for r in records]).encode("utf-8"))

    def pre_commit(self, checkpoint_id: int) -> None:
        data = b"".join(self._buffer)
        self._buffer = []
        with self._lock:
            if self._sealed and checkpoint_id <= self._sealed[-1][0]:
                raise ValueError(f"{self._path}: checkpoint {checkpoint_id} sealed after {self._sealed[-1][0]}")
            if data:
                self._sealed.append((checkpoint_id, data))

    def commit(self, checkpoint_id: int) -> None:
        """Append the sealed transactions up to ``checkpoint_id``, in order, and fsync."""
        with self._commit_lock:
            with self._lock:
                chunks = [data for cid, data in self._sealed if cid <= checkpoint_id]
                committed = self._committed
            with self._fence_locked() as owner:
                if owner != self._attempt:
                    raise StaleAttemptError(self._refusal(owner))
                size = self._append(committed, chunks)
            # A snapshot taken meanwhile saw the old length with these transactions
            # still sealed: restoring it writes the same bytes again.
            with self._lock:
                self._committed = size
                del self._sealed[: len(chunks)]

    def snapshot(self) -> dict:
        """The committed length and the sealed transactions, as one consistent pair."""
        with self._lock:
            return {"path": self._path, "committed": self._committed, "transactions": list(self._sealed)}

    def restore(self, state: dict) -> None:
        """Cut the file back to the snapshot's committed length and commit its sealed
        transactions (they belong to a completed checkpoint) again."""
        if state["path"] != self._path:
            raise ValueError(
                f"{self._path}: cannot restore the state of {state['path']} (was the parallelism changed?)"
            )
        with self._lock:
            self._committed = state["committed"]
            self._sealed = [(cid, data) for cid, data in state["transactions"]]
        self.commit(math.inf)

    def close(self) -> None:
        """Release the file. The runtime commits the last checkpoint before closing, so
        lines still buffered or sealed here belong to no completed checkpoint (the task
        failed, or the caller skipped a barrier, which is a bug): they are not written,
        only reported; a recovery replays them from the last checkpoint."""
        if getattr(self, "_file", None) is None:
            return
        with self._commit_lock:
            left = sum(map(len, self._buffer)) + sum(len(data) for _, data in self._sealed)
            if left:
                log.warning("%s: closed with %d bytes of output not committed; they are not written", self._path, left)
            self._file.close()
            self._file = None
            os.close(self._fence)

    @contextmanager
    def _fence_locked(self):
        """Hold the fence's lock (between processes) and give its owner: (app id, app
        start ms, epoch), or None before any attempt wrote it."""
        fcntl.flock(self._fence, fcntl.LOCK_EX)
        try:
            fields = os.pread(self._fence, _FENCE_BYTES, 0).split()
            yield tuple(map(int, fields)) if fields else None
        finally:
            fcntl.flock(self._fence, fcntl.LOCK_UN)

    def _refusal(self, owner) -> str:
        def attempt(fence) -> str:
            app_id, start_ms, epoch = fence
            return f"attempt {epoch} of application {app_id} (started at {start_ms})"

        holder = "no attempt (its fence was emptied)" if owner is None else attempt(owner)
        return (f"{self._path}: {attempt(self._attempt)} may not write: the file belongs to {holder}; "
                "this attempt was replaced")

    def _append(self, committed: int, chunks: list[bytes]) -> int:
        """Cut the file to ``committed`` bytes, append ``chunks``, fsync; the new length."""
        fd = self._file.fileno()
        size = os.fstat(fd).st_size
        if size < committed:
            raise ValueError(
                f"{self._path} has {size} bytes, fewer than the {committed} committed: it was changed outside gearbus"
            )
        if size == committed and not chunks:
            return size
        if size > committed:
            os.ftruncate(fd, committed)
        for data in chunks:
            self._file.write(data)
        self._file.flush()
        os.fsync(fd)
        return committed + sum(map(len, chunks))


class DiscardSink(DataSink):
    """Writes nothing (Flink's blackhole): the cost of a pipeline without its output's,
    for benchmarks. Counts what it was given (``written``, per task)."""

    transactional = True  # nothing becomes visible, so nothing can be seen twice

    def open(self, context: TaskContext) -> None:
        self.written = 0

    def write(self, records: list[Record]) -> None:
        self.written += len(records)


class CollectSink(DataSink):
    """Collects values into a Python list, for tests (TestRunner only: the list lives
    in the process that runs the pipeline)."""

    runners = frozenset({"test"})

    def __init__(self, target: list | None = None):
        self.values = [] if target is None else target

    def __deepcopy__(self, memo):
        return self  # every task of the sink appends to the one list

    def write(self, records: list[Record]) -> None:
        self.values.extend(r.value for r in records)
