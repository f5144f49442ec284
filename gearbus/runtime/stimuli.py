"""A state machine's stimulus log (dask's): every event it took, as data, with an id,
its arguments, its time and what it decided, the last ``STIMULI_KEPT`` of them. What
`gearbus status ID --debug` shows of an app's AppMaster: the story of how the app came
to where it is, told by the machine that decided it.

A machine marks its event methods with :func:`stimulus` and keeps a :class:`StimulusLog`
as ``self.stimuli``. Events that happen all the time and decided nothing (a tick with
nothing due, an acknowledgement that was not the last) are left out: they would push
the rest out of the log."""

from __future__ import annotations

import collections
import functools
import inspect
import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

STIMULI_KEPT = 500
DETAIL_CHARS = 80  # of one argument's value

Method = TypeVar("Method", bound=Callable[..., Any])


@dataclass(frozen=True)
class Stimulus:
    stimulus_id: int
    event: str
    at: float  # the machine's time (the event's ``now``, or the last one it was given)
    detail: str  # its arguments, but the time
    decided: tuple[str, ...]  # the kinds of the instructions it returned


class StimulusLog:
    def __init__(self, quiet: frozenset[str] = frozenset(), kept: int = STIMULI_KEPT):
        """``quiet``: events recorded only when they decide something."""
        self.quiet = quiet
        self.entries: collections.deque[Stimulus] = collections.deque(maxlen=kept)
        self.now = 0.0
        self._ids = itertools.count(1)

    def record(self, event: str, arguments: dict[str, Any], decided: Any) -> None:
        now = arguments.pop("now", None)
        if isinstance(now, (int, float)):
            self.now = float(now)
        kinds = tuple(type(i).__name__ for i in decided) if isinstance(decided, list) else ()
        if event in self.quiet and not kinds:
            return
        detail = ", ".join(f"{name}={_short(value)}" for name, value in arguments.items())
        self.entries.append(Stimulus(next(self._ids), event, self.now, detail, kinds))


def _short(value: Any) -> str:
    if hasattr(value, "error_type") and hasattr(value, "message"):  # an AppError: what and why
        value = f"{value.error_type}: {value.message}"
    text = repr(value)
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS - 1] + "…"


def stimulus(method: Method) -> Method:
    """Record each call of an event method in its machine's ``stimuli``, with what it returned."""
    signature = inspect.signature(method)

    @functools.wraps(method)
    def event(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs).arguments
        decided = method(self, *args, **kwargs)
        arguments.pop("self")
        self.stimuli.record(method.__name__, dict(arguments), decided)
        return decided
    return event  # type: ignore[return-value]
