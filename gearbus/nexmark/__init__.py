"""Nexmark, the online-auction benchmark, on gearbus: a seeded, deterministic generator of
its people, auctions and bids, sources that read them (generated, from an events file or
from JetStream), and the helper every query file under ``examples/nexmark`` uses. See
docs/nexmark.md."""

from gearbus.nexmark.generator import (
    AUCTION,
    BID,
    EVENT,
    EVENT_TYPES,
    KINDS,
    PERSON,
    WATERMARK_DELAY_MS,
    Generator,
    GeneratorConfig,
)
from gearbus.nexmark.jetstream import publish_events
from gearbus.nexmark.query import Query, WindowRow, column, query
from gearbus.nexmark.schema import COLUMNS, problem
from gearbus.nexmark.sources import EventsFileSource, GeneratorSource
from gearbus.nexmark.winning_bids import WinningBid, winning_bids
from gearbus.nexmark.writer import write_events

__all__ = [
    "AUCTION",
    "BID",
    "COLUMNS",
    "EVENT",
    "EVENT_TYPES",
    "KINDS",
    "PERSON",
    "WATERMARK_DELAY_MS",
    "EventsFileSource",
    "Generator",
    "GeneratorConfig",
    "GeneratorSource",
    "Query",
    "WindowRow",
    "WinningBid",
    "column",
    "problem",
    "publish_events",
    "query",
    "winning_bids",
    "write_events",
]
