"""Nexmark Q2, selection: the bids on every 123rd auction (``MOD(auction, 123) = 0``).

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q2.py --events 100000 --output q2.jsonl

Output rows: ``{"auction", "price"}``.
"""

from __future__ import annotations

from gearbus import nexmark


def selected(bid: dict) -> bool:
    return bid["auction"] % 123 == 0


def row(bid: dict) -> dict:
    return {"auction": bid["auction"], "price": bid["price"]}


def application(args: list[str]):
    q = nexmark.query("q2", args)
    q.output(q.bids().filter(selected, name="q2").map(row, name="columns"))
    return q.pipeline
