"""Event-time windows as the user describes them: assigners, triggers, accumulation and
the panes they produce. The operator that computes the panes is the runtime's
(:mod:`gearbus.runtime.windows`).

Time follows Flink. Timestamps and watermarks are int epoch milliseconds; a watermark W
promises that no record with timestamp <= W will arrive. A window is the half-open
interval [start, end); it is *complete* when W >= end - 1, and then fires its ON_TIME
pane. Its state is kept for the allowed lateness L, until W >= end - 1 + L: a record
that arrives for a complete window in that time is added and fires a LATE pane; after
it, the record is dropped (counted, or kept for a side output). WATERMARK_MAX, the final
watermark of a bounded input, fires every window and then clears all state.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from operator import index
from typing import Any, NamedTuple

from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from shared.values import register_tuple_type

__all__ = [
    "EARLY",
    "GLOBAL_WINDOW",
    "LATE",
    "ON_TIME",
    "WATERMARK_MAX",
    "WATERMARK_MIN",
    "Accumulation",
    "GlobalWindows",
    "SessionWindows",
    "SlidingWindows",
    "Trigger",
    "Triggers",
    "TumblingWindows",
    "Window",
    "WindowAssigner",
    "WindowResult",
]

EARLY = "early"
ON_TIME = "on_time"
LATE = "late"


class Window(NamedTuple):
    """The event-time interval [start, end); its last timestamp is end - 1."""

    start: int
    end: int


GLOBAL_WINDOW = Window(WATERMARK_MIN, WATERMARK_MAX)

#: ``_tuple(Window, (start, end))`` builds a NamedTuple at C speed (see task.new_record).
_tuple = tuple.__new__


class WindowResult(NamedTuple):
    """One pane: the aggregate of ``key`` in the window [window_start, window_end).

    ``timing`` is "early" (fired by an early trigger before the window completed),
    "on_time" (fired when the watermark completed it) or "late" (a late record arrived
    within the allowed lateness).
    """

    key: Any
    value: Any
    window_start: int
    window_end: int
    timing: str

    @property
    def final(self) -> bool:
        """True for panes fired once the window is complete (Samza's "final" flag)."""
        return self.timing != EARLY


register_tuple_type(2, WindowResult)  # results keep their type when they cross the bus


def checked_millis(name: str, value: Any, minimum: int | None = None) -> int:
    """``value`` as an int number of milliseconds (at least ``minimum``), or a ValueError naming ``name``."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be an int number of milliseconds, got {value!r}")
    try:
        value = index(value)
    except TypeError:
        raise ValueError(f"{name} must be an int number of milliseconds, got {value!r}") from None
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


# --- assigners ---------------------------------------------------------------------


class WindowAssigner:
    """Maps a record's timestamp to the windows it belongs to."""

    #: True when windows of one key merge (sessions).
    merging = False

    def assign(self, timestamp: int) -> tuple[Window, ...]:
        """The windows of a record with this timestamp, in ascending order."""
        raise NotImplementedError


class TumblingWindows(WindowAssigner):
    """Back-to-back windows of ``size_ms``: [offset + k*size, offset + (k+1)*size)."""

    def __init__(self, size_ms: int, offset_ms: int = 0):
        self.size_ms = checked_millis("size_ms", size_ms, 1)
        self.offset_ms = checked_millis("offset_ms", offset_ms) % self.size_ms
        self._last: tuple = (None, ())

    def assign(self, timestamp: int) -> tuple[Window, ...]:
        # Floor modulo puts negative timestamps in the right window. Consecutive records
        # mostly share a window, so reuse the last answer; one tuple swap keeps it atomic.
        start = timestamp - (timestamp - self.offset_ms) % self.size_ms
        last = self._last
        if last[0] != start:
            last = self._last = (start, (_tuple(Window, (start, start + self.size_ms)),))
        return last[1]

    def __repr__(self) -> str:
        return f"TumblingWindows(size_ms={self.size_ms}, offset_ms={self.offset_ms})"


class SlidingWindows(WindowAssigner):
    """Windows of ``size_ms`` starting every ``slide_ms``; a record is in every window
    that contains it (ceil or floor of size/slide of them)."""

    def __init__(self, size_ms: int, slide_ms: int, offset_ms: int = 0):
        self.size_ms = checked_millis("size_ms", size_ms, 1)
        self.slide_ms = checked_millis("slide_ms", slide_ms, 1)
        if self.slide_ms > self.size_ms:
            raise ValueError(
                f"slide_ms ({self.slide_ms}) must not exceed size_ms ({self.size_ms}): "
                "records between windows would silently belong to none"
            )
        self.offset_ms = checked_millis("offset_ms", offset_ms) % self.slide_ms
        self._last: tuple = (None, ())

    def assign(self, timestamp: int) -> tuple[Window, ...]:
        size, slide = self.size_ms, self.slide_ms
        last = timestamp - (timestamp - self.offset_ms) % slide
        first = last - (last - timestamp + size - 1) // slide * slide
        cached = self._last
        if cached[0] != (first, last):
            windows = tuple(_tuple(Window, (s, s + size)) for s in range(first, last + 1, slide))
            cached = self._last = ((first, last), windows)
        return cached[1]

    def __repr__(self) -> str:
        return f"SlidingWindows(size_ms={self.size_ms}, slide_ms={self.slide_ms}, offset_ms={self.offset_ms})"


class SessionWindows(WindowAssigner):
    """Per-key activity sessions: each record opens [ts, ts + gap_ms), and windows of one
    key that overlap or touch merge into one."""

    merging = True

    def __init__(self, gap_ms: int):
        self.gap_ms = checked_millis("gap_ms", gap_ms, 1)

    def assign(self, timestamp: int) -> tuple[Window, ...]:
        return (_tuple(Window, (timestamp, timestamp + self.gap_ms)),)

    def __repr__(self) -> str:
        return f"SessionWindows(gap_ms={self.gap_ms})"


class GlobalWindows(WindowAssigner):
    """One window for all time, [WATERMARK_MIN, WATERMARK_MAX): it completes only at the
    final watermark, so use it on bounded inputs or with an early trigger."""

    _WINDOWS = (GLOBAL_WINDOW,)

    def assign(self, timestamp: int) -> tuple[Window, ...]:
        return self._WINDOWS

    def __repr__(self) -> str:
        return "GlobalWindows()"


# --- triggers ----------------------------------------------------------------------
# Triggers are descriptions that the operator interprets. Every window fires when the
# watermark completes it; ``Triggers.repeat(t)`` adds early panes each time ``t`` fires.
# Only a record count is supported as ``t``; a processing-time one would add a
# ProcessingTimeTrigger here and an ``on_processing_time(now)`` method to the operator.


class Trigger:
    """Base of trigger descriptions."""


@dataclass(frozen=True)
class WatermarkTrigger(Trigger):
    """Fires once, ON_TIME, when the watermark completes the window (the default)."""


@dataclass(frozen=True)
class CountTrigger(Trigger):
    """Fires when ``count`` records have arrived since the pane last fired."""

    count: int


@dataclass(frozen=True)
class RepeatTrigger(Trigger):
    """Fires ``trigger`` again and again as an early trigger, before the watermark one."""

    trigger: Trigger


class Triggers:
    """Trigger factories in the style of Samza's ``Triggers``."""

    @staticmethod
    def watermark() -> WatermarkTrigger:
        return WatermarkTrigger()

    @staticmethod
    def count(n: int) -> CountTrigger:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"Triggers.count needs a positive int, got {n!r}")
        return CountTrigger(n)

    @staticmethod
    def repeat(trigger: Trigger) -> RepeatTrigger:
        if not isinstance(trigger, CountTrigger):
            raise ValueError(f"Triggers.repeat supports only Triggers.count(n), got {trigger!r}")
        return RepeatTrigger(trigger)


class Accumulation(enum.Enum):
    """What a pane carries after the first one of its (key, window)."""

    #: Only what arrived since the previous pane: the panes of a window sum to its total.
    DISCARDING = "discarding"
    #: Everything so far: each pane supersedes the previous one.
    ACCUMULATING = "accumulating"
