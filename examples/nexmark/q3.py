"""Nexmark Q3, local item suggestion: the auctions in category 10 whose sellers live in
Oregon, Idaho or California, with the seller's name, city and state.

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q3.py --events 100000 --output q3.jsonl

Output rows: ``{"name", "city", "state", "id"}``. The SQL's join is unwindowed, so a
seller's auctions meet their seller whatever the times: a keyed state machine per seller
(as Beam's Nexmark writes Q3) keeps the seller once seen and the auctions that came
before it, and emits each pair as soon as both are there. Its state is the selected
sellers and their early auctions.
"""

from __future__ import annotations

from gearbus import KeyedProcessFunction, nexmark

STATES = ("OR", "ID", "CA")


def local_seller(person: dict) -> bool:
    return person["state"] in STATES


def in_category(auction: dict) -> bool:
    return auction["category"] == 10


def tag_person(person: dict) -> tuple:
    return "person", person


def tag_auction(auction: dict) -> tuple:
    return "auction", auction


def seller(tagged: tuple) -> int:
    kind, row = tagged
    return row["id"] if kind == "person" else row["seller"]


def row(person: dict, auction: dict) -> dict:
    return {"name": person["name"], "city": person["city"], "state": person["state"], "id": auction["id"]}


class SellerJoin(KeyedProcessFunction):
    """State per seller: ``{"person": row | None, "auctions": [auctions before it]}``."""

    def process(self, tagged, ctx):
        kind, value = tagged
        state = ctx.state or {"person": None, "auctions": []}
        if kind == "person":
            state["person"] = value
            for auction in state["auctions"]:
                ctx.emit(row(value, auction))
            state["auctions"] = []
        elif state["person"] is not None:
            ctx.emit(row(state["person"], value))
        else:
            state["auctions"].append(value)
        ctx.state = state


def application(args: list[str]):
    q = nexmark.query("q3", args)
    people = q.persons().filter(local_seller, name="local_sellers").map(tag_person, name="tag_people")
    auctions = q.auctions().filter(in_category, name="category_10").map(tag_auction, name="tag_auctions")
    joined = (people.merge(auctions, name="sellers_and_auctions")
              .group_by(seller, name="by_seller")
              .process_keyed(SellerJoin, name="q3"))
    q.output(joined)
    return q.pipeline
