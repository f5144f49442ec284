"""What every Nexmark query file shares: its command line, its three input streams and its
output, so a query file is only the query::

    from gearbus import nexmark

    def application(args):
        q = nexmark.query("q2", args)
        q.output(q.bids().filter(lambda b: b["auction"] % 123 == 0)
                         .map(lambda b: {"auction": b["auction"], "price": b["price"]}))
        return q.pipeline

The events come from the generator (``--events N``: the first N; ``--rate R`` alone: endless,
R events per second), an events file (``--input``) or a JetStream stream that
:func:`gearbus.nexmark.publish_events` filled (``--jetstream``). Streams carry the inner
objects (a person's, an auction's or a bid's columns) with event time ``dateTime`` and the
DDL's watermark, 4 s behind the newest ``dateTime``.
"""

from __future__ import annotations

import argparse
import os
from operator import itemgetter

from gearbus.connectors.dsl import Pipeline, Stream
from gearbus.connectors.files import DiscardSink
from gearbus.nexmark.generator import AUCTION, BID, DEFAULT_BASE_TIME_MS, EVENT, PERSON, WATERMARK_DELAY_MS, \
    GeneratorConfig
from gearbus.nexmark.jetstream import subjects
from gearbus.nexmark.sources import EventsFileSource, GeneratorSource, OfKind, event_date_time

DEFAULT_PARALLELISM = 2


def parser(name: str) -> argparse.ArgumentParser:
    """The command line of a query file."""
    parser = argparse.ArgumentParser(prog=name, description=f"Nexmark {name.upper()} (gearbus.nexmark)")
    source = parser.add_argument_group("events (one of --events, --input, --jetstream, or --rate alone)")
    chosen = source.add_mutually_exclusive_group()
    chosen.add_argument("--events", type=int, metavar="N", help="generate the first N events")
    chosen.add_argument("--input", metavar="EVENTS.jsonl", help="read an events file (JSON Lines, the DDL's schema)")
    chosen.add_argument("--jetstream", metavar="STREAM",
                        help="read a JetStream stream that gearbus.nexmark.publish_events filled")
    source.add_argument("--rate", type=int, metavar="R",
                        help="generator: events per second of event time (default 10000); without --events the "
                             "generator never ends and emits R events per second")
    source.add_argument("--seed", type=int, help="generator: the seed (default 0)")
    source.add_argument("--base-time", type=int, metavar="MS",
                        help=f"generator: event 0's dateTime, epoch ms (default {DEFAULT_BASE_TIME_MS})")
    source.add_argument("--servers", metavar="URLS", help="--jetstream: NATS URLs, comma-separated (default: the "
                                                          "cluster's)")
    source.add_argument("--follow", action="store_true",
                        help="--jetstream: keep reading what arrives (default: what the stream holds at the start)")
    source.add_argument("--until", type=int, metavar="SEQ",
                        help="--jetstream: read up to the message with stream sequence SEQ, waiting for it to arrive")
    output = parser.add_mutually_exclusive_group(required=True)
    output.add_argument("--output", metavar="OUT.jsonl", help="write the results as JSON Lines")
    output.add_argument("--blackhole", action="store_true",
                        help="write the results nowhere (Flink's blackhole sink): for benchmarks")
    parser.add_argument("--all-events", action="store_true",
                        help="read every event from one source and keep the kinds the query uses, as the nexmark "
                             "repository's harness does (its figures count every event); by default each kind "
                             "has a source of its own that makes or reads only that kind")
    parser.add_argument("--dump-events", metavar="PATH",
                        help="with --events: also write the generated events to PATH as an events file")
    parser.add_argument("--parallelism", type=int, default=DEFAULT_PARALLELISM,
                        help=f"tasks per source and stage (default {DEFAULT_PARALLELISM})")
    return parser


def parse(name: str, args: list[str]) -> argparse.Namespace:
    """The options of a query file; a bad combination is an argparse error."""
    p = parser(name)
    opts = p.parse_args(args)
    generated = opts.events is not None or (opts.input is None and opts.jetstream is None)
    if opts.events is None and opts.input is None and opts.jetstream is None and opts.rate is None:
        p.error("say where the events come from: --events N, --input EVENTS.jsonl, --jetstream STREAM, or --rate R "
                "for an endless generator")
    if not generated and any(v is not None for v in (opts.rate, opts.seed, opts.base_time)):
        p.error("--rate, --seed and --base-time configure the generator; they go with --events (or --rate alone)")
    if opts.jetstream is None and (opts.servers is not None or opts.follow or opts.until is not None):
        p.error("--servers, --follow and --until go with --jetstream")
    if opts.follow and opts.until is not None:
        p.error("--follow reads forever, --until up to a sequence: give one of them")
    if opts.dump_events is not None and opts.events is None:
        p.error("--dump-events writes the generated events: it needs --events N")
    for option, value in (("--events", opts.events), ("--rate", opts.rate), ("--parallelism", opts.parallelism),
                          ("--until", opts.until)):
        if value is not None and value < 1:
            p.error(f"{option} must be at least 1, got {value}")
    if opts.input is not None and not os.path.isfile(opts.input):
        p.error(f"input file {opts.input} does not exist")
    return opts


def config_of(opts: argparse.Namespace) -> GeneratorConfig:
    """The generator's configuration from the options (the defaults where not given)."""
    given = {"rate": opts.rate, "seed": opts.seed, "base_time_ms": opts.base_time}
    return GeneratorConfig(**{name: value for name, value in given.items() if value is not None})


class Query:
    """One query's pipeline (``pipeline``), its inputs and its output."""

    def __init__(self, name: str, opts: argparse.Namespace):
        self.name = name
        self.opts = opts
        self.parallelism = opts.parallelism
        self.pipeline = Pipeline(f"nexmark-{name}", parallelism=opts.parallelism)
        self._streams: dict[tuple[str, bool], Stream] = {}
        if opts.dump_events is not None:
            (self.pipeline.source(GeneratorSource(EVENT, config_of(opts), opts.events), name="dump_events")
             .write_jsonl(os.path.abspath(opts.dump_events), name="write_dump_events"))

    def persons(self, ingestion_time: bool = False) -> Stream:
        """The people (columns id, name, emailAddress, creditCard, city, state, dateTime, extra)."""
        return self._read(PERSON, ingestion_time)

    def auctions(self, ingestion_time: bool = False) -> Stream:
        """The auctions (columns id, itemName, description, initialBid, reserve, dateTime,
        expires, seller, category, extra)."""
        return self._read(AUCTION, ingestion_time)

    def bids(self, ingestion_time: bool = False) -> Stream:
        """The bids (columns auction, bidder, price, channel, url, dateTime, extra).
        ``ingestion_time``: stamp them when read instead (processing-time queries); from
        JetStream, that is when the stream stored them."""
        return self._read(BID, ingestion_time)

    def output(self, stream: Stream) -> None:
        """Write ``stream``'s values as JSON Lines to ``--output`` (or nowhere: ``--blackhole``)."""
        if self.opts.blackhole:
            stream.sink(DiscardSink(), parallelism=self.parallelism, name="output")
        else:
            stream.write_jsonl(os.path.abspath(self.opts.output), name="output")

    def _read(self, kind: str, ingestion_time: bool) -> Stream:
        key = (kind, ingestion_time)
        if key not in self._streams:
            name = f"{kind}s" + ("_ingested" if ingestion_time else "")
            if self.opts.all_events and kind != EVENT:
                events = self._read(EVENT, ingestion_time)
                self._streams[key] = events.filter(OfKind(kind), name=f"{name}_only").map(itemgetter(kind), name=name)
            else:
                self._streams[key] = self._source(kind, ingestion_time, name)
        return self._streams[key]

    def _source(self, kind: str, ingestion_time: bool, name: str) -> Stream:
        opts, p = self.opts, self.pipeline
        delay = 0 if ingestion_time else WATERMARK_DELAY_MS
        if opts.jetstream is not None:
            events = p.read_jetstream(opts.jetstream, subjects(opts.jetstream, "*" if kind == EVENT else kind),
                                      until=None if opts.follow else opts.until or "now",
                                      timestamp_fn=None if ingestion_time else event_date_time,
                                      max_out_of_orderness_ms=delay, servers=opts.servers, name=f"{name}_events")
            return events if kind == EVENT else events.map(itemgetter(kind), name=name)
        if opts.input is not None:
            source = EventsFileSource(os.path.abspath(opts.input), kind, event_time=not ingestion_time)
        else:
            source = GeneratorSource(kind, config_of(opts), opts.events, event_time=not ingestion_time)
        return p.source(source, name=name, parallelism=self.parallelism, max_out_of_orderness_ms=delay)


def column(name: str):
    """A function that picks column ``name`` of a row (a key function for ``group_by``)."""
    return itemgetter(name)


class WindowRow:
    """Turns a windowed aggregate's result into the SQL's row: ``{key: result.key, value:
    result.value, "starttime": window start, "endtime": window end}`` (epoch ms)."""

    def __init__(self, key: str, value: str):
        self.key, self.value = key, value

    def __call__(self, result) -> dict:
        return {self.key: result.key, self.value: result.value, "starttime": result.window_start,
                "endtime": result.window_end}


def query(name: str, args: list[str]) -> Query:
    """Parse a query file's arguments and start its pipeline, ``nexmark-<name>``."""
    return Query(name, parse(name, args))
