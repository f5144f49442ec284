"""Nexmark Q0, pass-through: every bid, as it came (measures the cost of reading and writing).

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q0.py --events 100000 --output q0.jsonl

Output rows: ``{"auction", "bidder", "price", "dateTime", "extra"}``. Options: see
docs/nexmark.md (``--events``, ``--input``, ``--jetstream``, ``--dump-events``, ...).
"""

from __future__ import annotations

from gearbus import nexmark


def row(bid: dict) -> dict:
    return {"auction": bid["auction"], "bidder": bid["bidder"], "price": bid["price"], "dateTime": bid["dateTime"],
            "extra": bid["extra"]}


def application(args: list[str]):
    q = nexmark.query("q0", args)
    q.output(q.bids().map(row, name="q0"))
    return q.pipeline
