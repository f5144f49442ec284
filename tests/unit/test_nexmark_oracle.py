"""The oracle's SQL against plain Python written from the queries' SQL, for the queries
other pipelines will be checked with (Q3-Q5, Q7-Q9, Q11): two translations that agree."""

from __future__ import annotations

import collections

import pytest

from gearbus.nexmark import GeneratorConfig, write_events
from tests.support.files import read_jsonl
from tests.support.nexmark import assert_same_rows, oracle

SECOND = 1000


@pytest.fixture(scope="module")
def events(tmp_path_factory) -> str:
    return write_events(tmp_path_factory.mktemp("oracle") / "events.jsonl", 5000, GeneratorConfig(seed=1, rate=100))


@pytest.fixture(scope="module")
def tables(events) -> dict[str, list[dict]]:
    rows = collections.defaultdict(list)
    for event in read_jsonl(events):
        kind = ("person", "auction", "bid")[event["event_type"]]
        rows[kind].append(event[kind])
    return rows


def tumble(ts: int, size: int) -> int:
    return ts - ts % size


def q3(t):
    people = {p["id"]: p for p in t["person"]}
    return [{"name": p["name"], "city": p["city"], "state": p["state"], "id": a["id"]}
            for a in t["auction"] if a["category"] == 10
            for p in [people.get(a["seller"])] if p and p["state"] in ("OR", "ID", "CA")]


def winning_bids(t):
    """Each auction's bids between its start and its expiry (inclusive), by auction."""
    auctions = {a["id"]: a for a in t["auction"]}
    won = collections.defaultdict(list)
    for b in t["bid"]:
        a = auctions.get(b["auction"])
        if a and a["dateTime"] <= b["dateTime"] <= a["expires"]:
            won[a["id"]].append(b)
    return auctions, won


def q4(t):
    auctions, won = winning_bids(t)
    finals = collections.defaultdict(list)
    for auction_id, bids in won.items():
        finals[auctions[auction_id]["category"]].append(max(b["price"] for b in bids))
    return [{"id": category, "final": sum(f) / len(f)} for category, f in finals.items()]


def q5(t):
    counts = collections.Counter()
    for b in t["bid"]:
        last = tumble(b["dateTime"], 2 * SECOND)
        for start in range(last - 8 * SECOND, last + 1, 2 * SECOND):
            counts[(start, b["auction"])] += 1
    best = collections.defaultdict(int)
    for (start, _), n in counts.items():
        best[start] = max(best[start], n)
    return [{"auction": a, "num": n} for (start, a), n in counts.items() if n == best[start]]


def q7(t):
    highest = collections.defaultdict(int)
    for b in t["bid"]:
        start = tumble(b["dateTime"], 10 * SECOND)
        highest[start + 10 * SECOND] = max(highest[start + 10 * SECOND], b["price"])
    return [{k: b[k] for k in ("auction", "bidder", "price", "dateTime", "extra")}
            for end, price in highest.items() for b in t["bid"]
            if b["price"] == price and end - 10 * SECOND <= b["dateTime"] <= end]


def q8(t):
    people = {(p["id"], p["name"], tumble(p["dateTime"], 10 * SECOND)) for p in t["person"]}
    sellers = {(a["seller"], tumble(a["dateTime"], 10 * SECOND)) for a in t["auction"]}
    return [{"id": i, "name": name, "stime": start} for i, name, start in people if (i, start) in sellers]


def q9(t):
    auctions, won = winning_bids(t)
    rows = []
    for auction_id, bids in won.items():
        top = min(bids, key=lambda b: (-b["price"], b["dateTime"], b["bidder"], b["extra"]))
        rows.append({**auctions[auction_id], "auction": top["auction"], "bidder": top["bidder"],
                     "price": top["price"], "bid_dateTime": top["dateTime"], "bid_extra": top["extra"]})
    return rows


def q11(t):
    by_bidder = collections.defaultdict(list)
    for b in t["bid"]:
        by_bidder[b["bidder"]].append(b["dateTime"])
    rows = []
    for bidder, times in by_bidder.items():
        times.sort()
        session = [times[0]]
        for ts in times[1:] + [None]:
            if ts is not None and ts - session[-1] <= 10 * SECOND:
                session.append(ts)
                continue
            rows.append({"bidder": bidder, "bid_count": len(session), "starttime": session[0],
                         "endtime": session[-1] + 10 * SECOND})
            session = [ts]
    return rows


@pytest.mark.parametrize("name, plain", [("q3", q3), ("q4", q4), ("q5", q5), ("q7", q7), ("q8", q8), ("q9", q9),
                                         ("q11", q11)])
def test_the_oracle_agrees_with_plain_python(name, plain, events, tables):
    expected = plain(tables)
    assert expected, f"{name}: no rows; the events exercise nothing"
    assert_same_rows(oracle(name, events), expected)


def test_an_unknown_query_is_refused(events):
    with pytest.raises(ValueError, match="no oracle for 'q6'"):
        oracle("q6", events)
