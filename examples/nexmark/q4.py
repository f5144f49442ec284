"""Nexmark Q4, average price per category: the average winning price of the auctions of
each category (a winning price: the highest bid between the auction's start and its
expiry).

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q4.py --events 100000 --output q4.jsonl

Output rows: ``{"id", "final"}`` (the category and the average, as the SQL names them),
one per category once the input has ended: the SQL's result is an aggregate over all
auctions. Winning bids come from ``nexmark.winning_bids``, a keyed state machine per
auction that emits when the auction expires.
"""

from __future__ import annotations

from gearbus import Mean, nexmark


def category(won: tuple) -> int:
    return won[0]["category"]


def price(won: tuple) -> int:
    return won[1]["price"]


def row(result) -> dict:
    return {"id": result.key, "final": result.value}


def application(args: list[str]):
    q = nexmark.query("q4", args)
    won = nexmark.winning_bids(q.auctions(), q.bids())
    averages = won.group_by(category, name="by_category").aggregate(Mean(price), name="average")
    q.output(averages.map(row, name="q4"))
    return q.pipeline
