"""File and collection connectors: a text file read line by line, an in-memory
collection, and a JSON Lines sink."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable
from typing import Any

from gearbus.api.task import DataSink, DataSource, Record, TaskContext, new_record, now_ms

READ_CHUNK_BYTES = 1 << 20


class TextFileSource(DataSource):
    """Reads a UTF-8 text file as one record per line (without the ``\\n``).

    With parallelism N the file is cut into N byte ranges; a task owns the lines that
    start inside its range (as Hadoop's input splits do), so every line is read once.
    """

    def __init__(self, path: str | os.PathLike, timestamp_fn: Callable[[str], int] | None = None):
        self.path = os.fspath(path)
        self.timestamp_fn = timestamp_fn

    def open(self, context: TaskContext) -> None:
        size = os.path.getsize(self.path)
        n, i = context.parallelism, context.index
        start, self._end = size * i // n, size * (i + 1) // n
        self._file = open(self.path, "rb")
        if start > 0:
            self._file.seek(start - 1)
            start = start - 1 + len(self._file.readline())  # skip the line owned by task i-1
        self._buffer_start = start
        self._carry = b""
        self._done = start >= self._end
        self._pending: list[Record] = []
        self._taken = 0

    def read(self, max_records: int) -> list[Record] | None:
        """At most ``max_records`` records, so batch boundaries (and with them the
        watermark's steps) are the same on every runner."""
        while self._taken >= len(self._pending):
            chunk = self._next_chunk()
            if chunk is None:
                return None
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
                return self._to_records(owned, owned_start)
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
    """Emits the items of a collection; task i of N takes items i, i+N, i+2N, ..."""

    def __init__(self, items: Iterable[Any], timestamp_fn: Callable[[Any], int] | None = None):
        self.items = list(items)
        self.timestamp_fn = timestamp_fn

    def open(self, context: TaskContext) -> None:
        self._mine = self.items[context.index :: context.parallelism]
        self._pos = 0

    def read(self, max_records: int) -> list[Record] | None:
        if self._pos >= len(self._mine):
            return None
        batch = self._mine[self._pos : self._pos + max_records]
        self._pos += len(batch)
        if self.timestamp_fn is not None:
            return [new_record(Record, (v, self.timestamp_fn(v), None)) for v in batch]
        ts = now_ms()
        return [new_record(Record, (v, ts, None)) for v in batch]


class JsonLinesSink(DataSink):
    """Writes each record's value as one JSON line.

    With parallelism 1 the file is ``path``; with more, task i writes
    ``<stem>-<i>.<ext>`` beside it.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = os.fspath(path)

    def open(self, context: TaskContext) -> None:
        path = self.path
        if context.parallelism > 1:
            stem, ext = os.path.splitext(path)
            path = f"{stem}-{context.index:05d}{ext}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        self._file = open(path, "w", encoding="utf-8")

    def write(self, records: list[Record]) -> None:
        """Write and flush each batch, so readers see records as they arrive."""
        dumps = json.dumps
        self._file.write("".join(dumps(r.value, ensure_ascii=False) + "\n" for r in records))
        self._file.flush()

    def close(self) -> None:
        if getattr(self, "_file", None) is not None:
            self._file.close()
            self._file = None


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
