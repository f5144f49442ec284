"""The Nexmark generator: the standard proportions and hot ratios, events as a function of
(seed, event number), references to what exists, bounded disorder, and the schema."""

from __future__ import annotations

import collections

import pytest

from gearbus.nexmark import (
    AUCTION,
    BID,
    COLUMNS,
    EVENT,
    PERSON,
    WATERMARK_DELAY_MS,
    Generator,
    GeneratorConfig,
    problem,
)
from gearbus.nexmark.schema import kind_of

EVENTS = 50_000


@pytest.fixture(scope="module")
def events() -> list[dict]:
    return Generator().events(0, EVENTS)


def inner(event: dict) -> dict:
    return event[kind_of(event)]


def test_kinds_come_one_to_three_to_forty_six(events):
    kinds = collections.Counter(kind_of(e) for e in events)
    assert kinds == {PERSON: EVENTS // 50, AUCTION: EVENTS // 50 * 3, BID: EVENTS // 50 * 46}
    assert [kind_of(e) for e in events[:50]] == [PERSON] + [AUCTION] * 3 + [BID] * 46


def test_hot_auctions_sellers_and_bidders_take_their_share(events):
    """Hot: the first auction (seller) or second person (bidder) of the newest batch of 100.
    Ratio r makes 1 - 1/r of the choices hot, plus the random ones that hit it."""
    last_person = last_auction = None
    hot = collections.Counter()
    totals = collections.Counter()
    for e in events:
        value = inner(e)
        if e["event_type"] == 0:
            last_person = value["id"] - 1000
        elif e["event_type"] == 1:
            last_auction = value["id"] - 1000
            totals["seller"] += 1
            hot["seller"] += value["seller"] - 1000 == last_person // 100 * 100
        else:
            totals["bid"] += 1
            hot["auction"] += value["auction"] - 1000 == last_auction // 100 * 100
            hot["bidder"] += value["bidder"] - 1000 == min(last_person // 100 * 100 + 1, last_person)
    assert 0.5 <= hot["auction"] / totals["bid"] < 0.53          # hot auction ratio 2
    assert 0.75 <= hot["bidder"] / totals["bid"] < 0.77          # hot bidders ratio 4
    assert 0.73 <= hot["seller"] / totals["seller"] < 0.78       # hot sellers ratio 4


def test_bids_reference_existing_auctions_and_people_and_auctions_existing_sellers(events):
    people, auctions = set(), set()
    for e in events:
        value = inner(e)
        if e["event_type"] == 0:
            people.add(value["id"])
        elif e["event_type"] == 1:
            assert value["seller"] in people
            auctions.add(value["id"])
        else:
            assert value["auction"] in auctions and value["bidder"] in people
    assert len(people) == EVENTS // 50 and min(people) == 1000 and min(auctions) == 1000


def test_bids_go_to_the_auctions_in_flight(events):
    newest = 0
    for e in events:
        value = inner(e)
        if e["event_type"] == 1:
            newest = value["id"]
        elif e["event_type"] == 2:
            assert newest - 100 <= value["auction"] <= newest


def test_times_follow_the_event_number_less_bounded_delays(events):
    config = GeneratorConfig()
    delays = [config.slot_time(n) - inner(e)["dateTime"] for n, e in enumerate(events)]
    assert all(0 <= d <= config.max_delay_ms for d in delays)
    assert 0.09 < sum(d > 0 for d in delays) / len(delays) < 0.11
    newest = float("-inf")
    for e in events:  # the DDL's watermark (4 s behind the newest) never makes an event late
        ts = inner(e)["dateTime"]
        assert ts > newest - WATERMARK_DELAY_MS
        newest = max(newest, ts)
    auctions = [inner(e) for e in events if e["event_type"] == 1]
    assert all(a["expires"] > a["dateTime"] for a in auctions)


def test_every_event_fits_the_schema(events):
    assert all(problem(e) is None for e in events)
    for kind, columns in COLUMNS.items():
        sample = next(inner(e) for e in events if kind_of(e) == kind)
        assert list(sample) == list(columns)
    assert {e["bid"]["channel"] for e in events if e["bid"]} >= {"Google", "Facebook", "Baidu", "Apple"}


def test_an_event_depends_on_the_seed_and_its_number_only():
    generator = Generator(GeneratorConfig(seed=7))
    whole = generator.events(0, 5000)
    pieces = generator.events(0, 1234) + generator.events(1234, 4321) + generator.events(4321, 5000)
    assert pieces == whole
    assert Generator(GeneratorConfig(seed=7)).events(0, 5000) == whole
    assert Generator(GeneratorConfig(seed=8)).events(0, 5000) != whole
    for kind in (PERSON, AUCTION, BID):
        numbers = generator.numbers(kind, 0, 5000)
        assert generator.values(kind, numbers)[0] == [whole[n][kind] for n in numbers.tolist()]


def test_tasks_share_the_event_numbers_by_epochs():
    generator = Generator()
    for kind in (PERSON, AUCTION, BID, EVENT):
        every = generator.numbers(kind, 0, 10_007).tolist()
        shares = [generator.numbers(kind, 0, 10_007, index, 3).tolist() for index in range(3)]
        assert sorted(sum(shares, [])) == every
        assert all(n // 50 % 3 == index for index, share in enumerate(shares) for n in share)
        assert generator.numbers(kind, 123, None, 1, 3, limit=10).tolist() == [n for n in shares[1] if n >= 123][:10]


def test_the_rate_and_base_time_place_the_events():
    config = GeneratorConfig(rate=100, base_time_ms=0, delayed_fraction=0)
    events = Generator(config).events(0, 1000)
    assert [inner(e)["dateTime"] for e in events] == [n * 10 for n in range(1000)]


@pytest.mark.parametrize("change, message", [
    ({"max_delay_ms": 4000}, "below the 4000 ms"),
    ({"rate": 0}, "rate must be at least 1"),
    ({"delayed_fraction": 2}, "between 0 and 1"),
    ({"seed": "x"}, "seed must be an int"),
])
def test_a_bad_configuration_is_refused(change, message):
    with pytest.raises(ValueError, match=message):
        GeneratorConfig(**change)
