"""Joins as the user describes them: what a joined record is, and the checks every join
makes when the pipeline is built. The operators are the runtime's
(:mod:`gearbus.runtime.joins`).

Three kinds, all in event time and exactly-once through recovery:

- a window join (``a.join(b, ...)``): the pairs of a key's records of both sides that
  fall in the same window, emitted when the watermark closes the window, stamped with
  the window's last instant (Flink's semantics); ``how`` adds unmatched records of one
  or both sides, paired with None;
- an interval join (``a.interval_join(b, ...)``): each left record ``l`` pairs with the
  right records ``r`` of its key where ``l.ts + lower_ms <= r.ts <= l.ts + upper_ms``,
  as soon as both are there, stamped ``max(l.ts, r.ts)``;
- a stream–table join (``a.join_table(table, ...)``): each record is enriched with the
  table's value for its key, the table being a changelog stream of upserts (a value of
  None deletes). ``as_of="latest"`` takes the value current when the record is
  processed (Samza's stream–table join); ``as_of="event_time"`` the value valid at the
  record's timestamp (a temporal join), so the record waits for the watermark.

A record's join key must be hashable and not None. A record that arrives behind the
watermark (later than its window, or than what it could still match) is dropped and
counted as late.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

from gearbus.api.graph import GraphError
from shared.values import register_tuple_type

__all__ = ["JOIN_KINDS", "Joined", "check_key_function"]

JOIN_KINDS = ("inner", "left", "right", "outer")
TABLE_MODES = ("latest", "event_time")


class Joined(NamedTuple):
    """One output of a join: the left record's value and the right one's (None for the
    missing side of an outer join, or for a record a table does not know in a left join)."""

    left: Any
    right: Any


register_tuple_type(3, Joined)  # joined values keep their type when they cross the bus


def check_key_function(step: str, what: str, fn: Callable | None) -> Callable:
    """``fn`` if it can compute keys, else a GraphError naming the step."""
    if fn is None:
        raise GraphError(f"join step {step!r}: {what} is required: a function giving each record's join key")
    if not callable(fn):
        raise GraphError(f"join step {step!r}: {what} must be a function of the record, got {fn!r}")
    return fn
