"""Aggregators in the style of Beam's CombineFn: how a window or group folds its values.

An aggregator turns values into an accumulator with :meth:`Aggregator.create` and
:meth:`Aggregator.add`, and the accumulator into the output with
:meth:`Aggregator.result`. One that also implements :meth:`Aggregator.merge` is
*combinable*: partial accumulators built on the map side of a shuffle, or in two session
windows that later merge, can be joined exactly. Partial accumulators travel between
processes, so accumulators must be msgpack-serialisable plain values (ints, floats,
strings, lists, tuples, dicts); a tuple comes back as a list, so accept both.

``add`` and ``merge`` may update their first argument in place and return it, but must
not modify the second one, which may belong to someone else.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any


class Aggregator:
    """Base of all aggregators; subclasses implement create, add, and ideally merge."""

    def create(self) -> Any:
        """A new, empty accumulator."""
        raise NotImplementedError

    def add(self, acc: Any, value: Any) -> Any:
        """The accumulator with ``value`` added."""
        raise NotImplementedError

    def merge(self, a: Any, b: Any) -> Any:
        """One accumulator holding what ``a`` and ``b`` hold (``a`` came first)."""
        raise TypeError(
            f"{type(self).__name__} has no merge, so its partial results cannot be combined "
            "(no map-side combine, no session windows)"
        )

    def result(self, acc: Any) -> Any:
        """The output for an accumulator."""
        return acc

    @property
    def combinable(self) -> bool:
        """True when :meth:`merge` is implemented."""
        return type(self).merge is not Aggregator.merge

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class Count(Aggregator):
    """The number of values."""

    def create(self) -> int:
        return 0

    def add(self, acc: int, value: Any) -> int:
        return acc + 1

    def merge(self, a: int, b: int) -> int:
        return a + b


class Sum(Aggregator):
    """The sum of the values, or of ``value_fn(value)``; 0 when empty."""

    def __init__(self, value_fn: Callable[[Any], Any] | None = None):
        self.value_fn = value_fn

    def create(self) -> Any:
        return 0

    def add(self, acc: Any, value: Any) -> Any:
        return acc + (value if self.value_fn is None else self.value_fn(value))

    def merge(self, a: Any, b: Any) -> Any:
        return a + b


class Reduce(Aggregator):
    """Combines values pairwise with ``fn(a, b)``; None when empty.

    None marks the empty accumulator, so the values must not be None. ``fn`` should be
    associative and commutative: records and partials arrive in no particular order.
    """

    def __init__(self, fn: Callable[[Any, Any], Any]):
        self.fn = fn

    def create(self) -> Any:
        return None

    def add(self, acc: Any, value: Any) -> Any:
        return value if acc is None else self.fn(acc, value)

    def merge(self, a: Any, b: Any) -> Any:
        if a is None:
            return b
        return a if b is None else self.fn(a, b)

    def __repr__(self) -> str:
        return f"Reduce({getattr(self.fn, '__name__', self.fn)!s})"


class Fold(Aggregator):
    """Folds values into ``zero`` with ``fn(acc, value)``, in arrival order.

    Not combinable: a fold has no way to join two partial results, so it cannot be
    pre-aggregated before a shuffle nor used with session windows.
    """

    def __init__(self, zero: Any, fn: Callable[[Any, Any], Any]):
        self.zero = zero
        self.fn = fn

    def create(self) -> Any:
        # A copy, so that an fn that mutates a list or dict zero cannot leak between windows.
        return copy.deepcopy(self.zero)

    def add(self, acc: Any, value: Any) -> Any:
        return self.fn(acc, value)

    def __repr__(self) -> str:
        return f"Fold({self.zero!r}, {getattr(self.fn, '__name__', self.fn)!s})"


class Mean(Aggregator):
    """The arithmetic mean of the values, or of ``value_fn(value)``; None when empty.

    The accumulator is ``(sum, count)``.
    """

    def __init__(self, value_fn: Callable[[Any], Any] | None = None):
        self.value_fn = value_fn

    def create(self) -> tuple:
        return (0, 0)

    def add(self, acc, value: Any) -> tuple:
        total, count = acc
        return (total + (value if self.value_fn is None else self.value_fn(value)), count + 1)

    def merge(self, a, b) -> tuple:
        return (a[0] + b[0], a[1] + b[1])

    def result(self, acc) -> float | None:
        total, count = acc
        return total / count if count else None


class AggregateFunction(Aggregator):
    """A user-defined aggregator from plain functions; combinable when ``merge`` is given.

    ``result`` defaults to returning the accumulator.
    """

    def __init__(
        self,
        create: Callable[[], Any],
        add: Callable[[Any, Any], Any],
        merge: Callable[[Any, Any], Any] | None = None,
        result: Callable[[Any], Any] | None = None,
    ):
        # Instance attributes shadow the methods, so the operator calls the user's
        # functions directly.
        self.create = create
        self.add = add
        if merge is not None:
            self.merge = merge
        if result is not None:
            self.result = result

    @property
    def combinable(self) -> bool:
        return "merge" in self.__dict__

    def __repr__(self) -> str:
        return f"AggregateFunction(create={getattr(self.create, '__name__', self.create)!s}, ...)"
