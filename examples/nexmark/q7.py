"""Nexmark Q7, highest bid: the bids whose price is the highest of a 10 s window, made
within that window's 10 s up to its end (inclusive at both ends, as q7.sql's BETWEEN is).

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q7.py --events 100000 --output q7.jsonl

Output rows: ``{"auction", "bidder", "price", "dateTime", "extra"}``. The maximum of each
tumbling window is stamped with the window's last instant (end - 1), so "made within
[end - 10 s, end]" is an interval join of bids and maxima on the price, the maximum
coming -1 to 9999 ms after the bid.
"""

from __future__ import annotations

from gearbus import Reduce, TumblingWindows, nexmark

SIZE_MS = 10_000


def everything(bid: dict) -> int:
    return 0


def price(bid: dict) -> int:
    return bid["price"]


def highest(result) -> int:
    return result.value


def row(pair) -> dict:
    bid = pair.left
    return {"auction": bid["auction"], "bidder": bid["bidder"], "price": bid["price"], "dateTime": bid["dateTime"],
            "extra": bid["extra"]}


def application(args: list[str]):
    q = nexmark.query("q7", args)
    bids = q.bids()
    maxima = (bids.map(price, name="prices").group_by(everything, name="all_bids").window(TumblingWindows(SIZE_MS))
              .reduce(max, name="max_price"))
    joined = bids.interval_join(maxima, left_key=price, right_key=highest, lower_ms=-1, upper_ms=SIZE_MS - 1,
                                name="highest_bids")
    q.output(joined.map(row, name="q7"))
    return q.pipeline
