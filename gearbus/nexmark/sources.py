"""Sources of Nexmark events: the generator (bounded, or endless at the events' rate) and an
events file. Each reads one kind (persons, auctions or bids: the inner objects) or whole
events, and stamps records with their ``dateTime`` (or, with ``event_time=False``, the
ingestion time). Both replay exactly: a snapshot is a read position."""

from __future__ import annotations

import os
import time
from operator import itemgetter

from gearbus.api.task import DataSource, Record, TaskContext, new_record, now_ms
from gearbus.connectors.files import JsonLinesSource
from gearbus.nexmark.generator import EVENT, EVENT_TYPES, KINDS, Generator, GeneratorConfig
from gearbus.nexmark.schema import problem, schema_error

#: Event numbers per Spark slice of a generator source.
SPARK_SLICE_EVENTS = 50_000

date_time = itemgetter("dateTime")


def event_date_time(event: dict) -> int:
    """The ``dateTime`` of a whole event."""
    inner = event["bid"] or event["auction"] or event["person"]
    return inner["dateTime"]


class OfKind:
    """Whether a whole event is of ``kind``: splits one stream of every event by kind."""

    def __init__(self, kind: str):
        self.code = EVENT_TYPES[_check_kind(kind, KINDS)]

    def __call__(self, event: dict) -> bool:
        return event["event_type"] == self.code


def _check_kind(kind: str, allowed: tuple) -> str:
    if kind not in allowed:
        raise ValueError(f"kind must be one of {', '.join(map(repr, allowed))}, got {kind!r}")
    return kind


class GeneratorSource(DataSource):
    """Generated events of ``kind`` (``"person"``, ``"auction"``, ``"bid"``, or ``"event"``
    for whole events of every kind): the first ``events`` of them, as fast as they are
    read, or with ``events=None`` endlessly, event n falling due ``n / config.rate`` seconds
    after the application started (a task that starts late catches up).

    Task i of N owns the epochs (cycles of the proportions) e with e % N == i. A snapshot
    is the next event number the task considers; a restored task makes exactly the
    events after it, the same ones, since an event is a function of its number."""

    replayable = True

    def __init__(self, kind: str, config: GeneratorConfig = GeneratorConfig(), events: int | None = None,
                 event_time: bool = True):
        self.kind = _check_kind(kind, KINDS + (EVENT,))
        if events is not None and (not isinstance(events, int) or isinstance(events, bool) or events < 0):
            raise ValueError(f"events must be a non-negative int or None (endless), got {events!r}")
        self.config = config
        self.events = events
        self.event_time = event_time

    @property
    def timestamp_fn(self):
        """How a record's time follows from its value (what runners other than the bus's apply)."""
        if not self.event_time:
            return None
        return event_date_time if self.kind == EVENT else date_time

    def open(self, context: TaskContext) -> None:
        self._generator = Generator(self.config)
        self._index, self._parallelism = context.index, context.parallelism
        self._started = context.app_start_ms / 1000 if context.app_start_ms else time.time()
        self._next = 0

    def _share(self) -> dict:
        return {"kind": self.kind, "events": self.events, "index": self._index, "parallelism": self._parallelism,
                "config": repr(self.config)}

    def snapshot(self) -> dict:
        return {**self._share(), "next": self._next}

    def restore(self, state: dict) -> None:
        mine = self._share()
        theirs = {name: state.get(name) for name in mine}
        if theirs != mine:
            raise ValueError(f"nexmark generator: cannot resume from a snapshot of another share (snapshot {theirs}, "
                             f"this task {mine}); were the configuration or the parallelism changed?")
        self._next = state["next"]

    def _stop(self) -> int | None:
        """One past the last event number readable now."""
        if self.events is not None:
            return self.events
        return int((time.time() - self._started) * self.config.rate) + 1

    def read(self, max_records: int) -> list[Record] | None:
        if self.events is not None and self._next >= self.events:
            return None
        numbers = self._generator.numbers(self.kind, self._next, self._stop(), self._index, self._parallelism,
                                          max_records)
        if not len(numbers):
            if self.events is not None:
                self._next = self.events
                return None
            return []
        self._next = int(numbers[-1]) + 1
        values, times = self._generator.values(self.kind, numbers)
        if not self.event_time:
            now = now_ms()
            return [new_record(Record, (v, now, None)) for v in values]
        return [new_record(Record, (v, t, None)) for v, t in zip(values, times)]

    def idle_wait_s(self) -> float:
        """Until this task's next event falls due."""
        upcoming = self._generator.numbers(self.kind, self._next, None, self._index, self._parallelism, 1)
        return max(self._started + int(upcoming[0]) / self.config.rate - time.time(), 0.0002)

    def spark_slices(self) -> range:
        """The first event numbers of contiguous slices that cover the bounded input, in order."""
        if self.events is None:
            raise ValueError("an endless generator (events=None) cannot be read as a bounded input")
        return range(0, self.events, SPARK_SLICE_EVENTS)

    def slice_values(self, start: int) -> list:
        """The values of the slice starting at event number ``start``."""
        generator = Generator(self.config)
        return generator.values(self.kind, generator.numbers(self.kind, start,
                                                             min(start + SPARK_SLICE_EVENTS, self.events)))[0]


class EventsFileSource(JsonLinesSource):
    """The events of ``kind`` in a Nexmark events file (JSON Lines, see
    :mod:`gearbus.nexmark.schema`): the inner objects, or whole events for ``"event"``. Every
    line of the task's split is checked; one that is not a Nexmark event fails the source
    with the file, the line number and what is wrong. Replays as a JSON Lines file does."""

    def __init__(self, path: str | os.PathLike, kind: str, event_time: bool = True):
        self.kind = _check_kind(kind, KINDS + (EVENT,))
        super().__init__(path, (event_date_time if kind == EVENT else date_time) if event_time else None)

    def select(self, event: dict):
        """The value of a checked event for this source, or None when it is of another kind."""
        if self.kind == EVENT:
            return event
        return event[self.kind] if event["event_type"] == EVENT_TYPES[self.kind] else None

    def _parse(self, lines, owned_start):
        events = super()._parse(lines, owned_start)
        values, kept = [], []
        blank = 0
        for index, event in enumerate(events):
            while not lines[index + blank].strip():
                blank += 1
            what = problem(event)
            if what is not None:
                offset = owned_start + sum(len(line.encode("utf-8")) + 1 for line in lines[:index + blank])
                raise schema_error(self.path, self.line_number(offset), what, lines[index + blank])
            value = self.select(event)
            if value is not None:
                values.append(value)
                kept.append(index + blank)
        self._kept = kept
        return values

    def _lines_holding(self, lines, values):
        """Lines up to the one of the ``values``-th value kept (``_kept``: the current chunk's)."""
        return self._kept[values - 1] + 1 if values else 0
