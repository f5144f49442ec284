"""Nexmark Q9, winning bids: every auction with its winning bid (the highest bid between
its start and its expiry; of equal prices the earliest, then the lowest bidder and extra).

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q9.py --events 100000 --output q9.jsonl

Output rows: the auction's columns, then ``auction, bidder, price, bid_dateTime,
bid_extra`` (the SQL's), one per auction with a valid bid, when it expires.
"""

from __future__ import annotations

from gearbus import nexmark


def row(won: tuple) -> dict:
    auction, bid = won
    return {**auction, "auction": bid["auction"], "bidder": bid["bidder"], "price": bid["price"],
            "bid_dateTime": bid["dateTime"], "bid_extra": bid["extra"]}


def application(args: list[str]):
    q = nexmark.query("q9", args)
    q.output(nexmark.winning_bids(q.auctions(), q.bids()).map(row, name="q9"))
    return q.pipeline
