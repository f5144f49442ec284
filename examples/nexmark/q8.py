"""Nexmark Q8, monitor new users: the people who opened an auction in the same 10 s
window in which they registered.

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q8.py --events 100000 --output q8.jsonl

Output rows: ``{"id", "name", "stime"}`` (the window's start, epoch ms). The SQL joins the
distinct (person, window) with the distinct (seller, window): the auctions are counted per
seller and window first (one result each, stamped with the window's last instant), then
window-joined with the people.
"""

from __future__ import annotations

from gearbus import TumblingWindows, nexmark

SIZE_MS = 10_000


def seller(auction: dict) -> int:
    return auction["seller"]


def person_id(person: dict) -> int:
    return person["id"]


def sellers_key(result) -> int:
    return result.key


def row(pair) -> dict:
    person = pair.left
    return {"id": person["id"], "name": person["name"], "stime": person["dateTime"] - person["dateTime"] % SIZE_MS}


def application(args: list[str]):
    q = nexmark.query("q8", args)
    sellers = q.auctions().group_by(seller, name="by_seller").window(TumblingWindows(SIZE_MS)).count(name="auctions_per_seller")
    joined = q.persons().join(sellers, left_key=person_id, right_key=sellers_key, window=TumblingWindows(SIZE_MS),
                              name="new_sellers")
    q.output(joined.map(row, name="q8"))
    return q.pipeline
