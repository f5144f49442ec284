"""Nexmark Q5, hot items: for each 10 s window sliding by 2 s, the auctions with the most
bids (all of them when several tie).

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q5.py --events 100000 --output q5.jsonl

Output rows: ``{"auction", "num"}`` (the SQL's columns; the window is not among them).
Windows are aligned to the epoch and hold [start, start + 10 s). A sliding count per auction
gives each window's counts; they are regrouped by window (each window's results carry the
time ``end - 1``, so a 2 s tumbling window catches exactly one sliding window's results),
where the maxima are kept.
"""

from __future__ import annotations

from gearbus import AggregateFunction, SlidingWindows, TumblingWindows, nexmark

SIZE_MS, SLIDE_MS = 10_000, 2_000


def window_start(result) -> int:
    return result.window_start


def add(acc: list, result) -> list:
    """acc: [the highest count, the auctions that have it]."""
    if result.value > acc[0]:
        return [result.value, [result.key]]
    if result.value == acc[0]:
        acc[1].append(result.key)
    return acc


def merge(a: list, b: list) -> list:
    if a[0] != b[0]:
        return a if a[0] > b[0] else [b[0], list(b[1])]
    return [a[0], a[1] + b[1]]


MAXIMA = AggregateFunction(create=lambda: [0, []], add=add, merge=merge)


def rows(result) -> list[dict]:
    num, auctions = result.value
    return [{"auction": a, "num": num} for a in auctions]


def itself(auction: int) -> int:
    return auction


def application(args: list[str]):
    q = nexmark.query("q5", args)
    auctions = q.bids().map(nexmark.column("auction"), name="auction_ids")  # only the column it counts travels
    counts = (auctions.group_by(itself, name="by_auction").window(SlidingWindows(SIZE_MS, SLIDE_MS))
              .count(name="bids_per_auction"))
    hottest = (counts.group_by(window_start, name="by_window").window(TumblingWindows(SLIDE_MS))
               .aggregate(MAXIMA, name="hottest"))
    q.output(hottest.flat_map(rows, name="q5"))
    return q.pipeline
