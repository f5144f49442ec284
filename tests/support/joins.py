"""Joins and keyed state checked against brute force: events out of order within a bound,
and the references every runner's output is held against (window, interval and as-of
joins; a tumbling count written by hand with timers)."""

from __future__ import annotations

import random
from collections import Counter

from gearbus import KeyedProcessFunction, SessionWindows

BUCKET = 100  # the Buckets function's bucket, in ms of event time


def t(event: dict) -> int:
    return event["t"]


def k(event: dict):
    return event["k"]


def numbered(drawn, side: str) -> list[dict]:
    """(key, time) pairs as events with ids ``side``0, ``side``1, ..."""
    return [{"id": f"{side}{i}", "k": key, "t": ts} for i, (key, ts) in enumerate(drawn)]


def ids(pairs) -> Counter:
    """Joined pairs of events as (left id, right id), None for a missing side."""
    return Counter((p.left and p.left["id"], p.right and p.right["id"]) for p in pairs)


def shuffled(events: list[dict], seed: int, delay: int) -> list[dict]:
    """``events`` in time order, then moved around by less than ``delay`` ms: never late."""
    rng = random.Random(seed)
    return sorted(events, key=lambda e: (e["t"] + rng.randrange(delay), rng.random()))


def bounded_order(events: list[dict], delay: int) -> list[dict]:
    """Check ``shuffled``'s promise: no event ``delay`` ms or more behind the newest before it."""
    newest = None
    for e in events:
        assert newest is None or e["t"] > newest - delay
        newest = e["t"] if newest is None else max(newest, e["t"])
    return events


def window_reference(left, right, assigner, how: str) -> Counter:
    """Pairs per key and window; sessions merge over both sides' records of a key."""
    groups: dict = {}
    if isinstance(assigner, SessionWindows):
        for key in {e["k"] for e in left + right}:
            tagged = sorted([(e["t"], 0, e) for e in left if e["k"] == key] +
                            [(e["t"], 1, e) for e in right if e["k"] == key], key=lambda x: x[0])
            session, end = [], None
            for ts, side, e in tagged:
                if end is not None and ts > end:
                    groups[(key, len(groups))] = session
                    session = []
                session.append((side, e))
                end = ts + assigner.gap_ms if end is None or ts > end else max(end, ts + assigner.gap_ms)
            if session:
                groups[(key, len(groups))] = session
    else:
        for side, records in ((0, left), (1, right)):
            for e in records:
                for window in assigner.assign(e["t"]):
                    groups.setdefault((e["k"], window), []).append((side, e))
    pairs = Counter()
    for members in groups.values():
        lefts = [e["id"] for side, e in members if side == 0]
        rights = [e["id"] for side, e in members if side == 1]
        if lefts and rights:
            pairs.update((a, b) for a in lefts for b in rights)
        elif lefts and how in ("left", "outer"):
            pairs.update((a, None) for a in lefts)
        elif rights and how in ("right", "outer"):
            pairs.update((None, b) for b in rights)
    return pairs


def interval_reference(left, right, lower: int, upper: int) -> Counter:
    return Counter((a["id"], b["id"]) for a in left for b in right
                   if a["k"] == b["k"] and a["t"] + lower <= b["t"] <= a["t"] + upper)


def as_of_reference(stream, table, ttl_ms=None, how="inner") -> Counter:
    """Each stream event with the table change of its key in force at its time (the
    latest at or before it; a change of value None deletes; older than ttl_ms: gone)."""
    pairs = Counter()
    for a in stream:
        changes = [b for b in table if b["k"] == a["k"] and b["t"] <= a["t"]]
        found = None
        if changes:
            newest = max(changes, key=lambda b: (b["t"], table.index(b)))
            if newest.get("v", 0) is not None and (ttl_ms is None or a["t"] < newest["t"] + ttl_ms):
                found = newest["id"]
        if found is not None or how == "left":
            pairs[(a["id"], found)] += 1
    return pairs


class Buckets(KeyedProcessFunction):
    """Counts a key's records per BUCKET ms of event time with one timer per bucket: a
    tumbling window written by hand."""

    def process(self, value, ctx):
        end = value["t"] - value["t"] % BUCKET + BUCKET - 1
        counts = ctx.state or {}
        counts[end] = counts.get(end, 0) + 1
        ctx.state = counts
        ctx.register_event_time_timer(end)

    def on_timer(self, timestamp, ctx):
        counts = ctx.state
        ctx.emit({"k": ctx.key, "n": counts.pop(timestamp), "at": timestamp})
        ctx.state = counts or None


def buckets_reference(events) -> Counter:
    counts = Counter((e["k"], e["t"] - e["t"] % BUCKET + BUCKET - 1) for e in events)
    return Counter((key, n, end) for (key, end), n in counts.items())
