"""Nexmark Q1, currency conversion: every bid with its price in euros (0.908 × dollars).

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q1.py --events 100000 --output q1.jsonl

Output rows: ``{"auction", "bidder", "price", "dateTime", "extra"}``; ``price`` is the SQL's
DECIMAL(23, 3) as the nearest float.
"""

from __future__ import annotations

from gearbus import nexmark


def in_euros(bid: dict) -> dict:
    return {"auction": bid["auction"], "bidder": bid["bidder"], "price": bid["price"] * 908 / 1000,
            "dateTime": bid["dateTime"], "extra": bid["extra"]}


def application(args: list[str]):
    q = nexmark.query("q1", args)
    q.output(q.bids().map(in_euros, name="q1"))
    return q.pipeline
