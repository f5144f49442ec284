"""Keyed state and timers as the user writes them (Flink's KeyedProcessFunction): a
function called per record with the record's key, that key's state and timers. The
operator that keeps them is the runtime's (:mod:`gearbus.runtime.keyed`).

    class Fraud(KeyedProcessFunction):
        def process(self, value, ctx):
            if value["amount"] > 1000 and ctx.state:      # a big one right after a small one
                ctx.emit({"card": ctx.key, "alert": value})
            ctx.state = value["amount"] < 1
            ctx.register_event_time_timer(ctx.timestamp + 60_000)

        def on_timer(self, timestamp, ctx):
            ctx.state = None                              # forget the key after a quiet minute

    cards.group_by(lambda t: t["card"]).process_keyed(Fraud, name="fraud")

Time follows the window operator's (see :mod:`gearbus.api.windows`): an event-time
timer for ``t`` fires once the watermark reaches ``t``, in timestamp order, and its
output carries ``t``; the final watermark of a bounded input fires every one left. A
processing-time timer fires once the task's clock reaches it; at the end of input, the
ones still pending are dropped (a bounded run does not wait for the clock).
"""

from __future__ import annotations

from typing import Any

from gearbus.api.graph import GraphError

__all__ = ["KeyedContext", "KeyedProcessFunction", "check_keyed_function"]


class KeyedContext:
    """What a keyed function sees of the current key: set by the runtime before each call.

    ``state`` is the key's state: None until set, any picklable value after (a dict for
    several fields); assigning None deletes it. Keep it small and bounded: it is held in
    memory and written into every checkpoint.
    """

    #: The key of the record (or timer) being handled.
    key: Any = None
    #: The record's event time (epoch ms); in ``on_timer``, the timer's time.
    timestamp: int = 0
    #: The task's input watermark.
    watermark: int = 0

    @property
    def state(self) -> Any:
        raise NotImplementedError

    @state.setter
    def state(self, value: Any) -> None:
        raise NotImplementedError

    def emit(self, value: Any, timestamp: int | None = None) -> None:
        """Send ``value`` downstream, keyed by the current key; its time defaults to the
        record's (or the event-time timer's)."""
        raise NotImplementedError

    def register_event_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` for this key once the watermark reaches
        ``timestamp`` (once per key and time, however often it is registered)."""
        raise NotImplementedError

    def delete_event_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError

    def register_processing_time_timer(self, timestamp: int) -> None:
        """Call ``on_timer(timestamp, ctx)`` once the task's clock (epoch ms) reaches it."""
        raise NotImplementedError

    def delete_processing_time_timer(self, timestamp: int) -> None:
        raise NotImplementedError

    def processing_time(self) -> int:
        """The task's clock, in epoch milliseconds."""
        raise NotImplementedError


class KeyedProcessFunction:
    """Subclass it (one instance per task) or pass a plain ``fn(value, ctx)`` instead."""

    def open(self, context) -> None:
        """Called once per task before the first record, with its TaskContext."""

    def process(self, value: Any, ctx: KeyedContext) -> None:
        """Called for every record of the key ``ctx.key``."""
        raise NotImplementedError(f"{type(self).__name__} must implement process(value, ctx)")

    def on_timer(self, timestamp: int, ctx: KeyedContext) -> None:
        """Called when a timer of ``ctx.key`` fires."""


def check_keyed_function(step: str, function) -> Any:
    """``function`` as process_keyed takes it (a KeyedProcessFunction subclass, or a plain
    callable ``fn(value, ctx)``), else a GraphError naming the step."""
    if isinstance(function, type):
        if not issubclass(function, KeyedProcessFunction):
            raise GraphError(f"process_keyed {step!r}: {function.__name__} is a class but not a KeyedProcessFunction")
        return function
    if isinstance(function, KeyedProcessFunction):
        raise GraphError(f"process_keyed {step!r}: pass the class {type(function).__name__}, not an instance "
                         "(each task makes its own)")
    if not callable(function):
        raise GraphError(f"process_keyed {step!r}: {function!r} is neither a function fn(value, ctx) nor a "
                         "KeyedProcessFunction subclass")
    return function
