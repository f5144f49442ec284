"""Nexmark Q12, processing-time windows: how many bids each bidder made per 10 s of
processing time.

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q12.py --events 100000 --output q12.jsonl

Output rows: ``{"bidder", "bid_count", "starttime", "endtime"}`` (epoch ms). gearbus has no
processing-time windows; a source without event time stamps each record with the time it
was read (ingestion time; from JetStream, the time the stream stored it), so windows over
those stamps are Flink's ``PROCTIME()`` windows up to the source's latency. The results
depend on when the query runs: per bidder, the counts add up to the bidder's bids.
"""

from __future__ import annotations

from gearbus import TumblingWindows, nexmark

SIZE_MS = 10_000


def application(args: list[str]):
    q = nexmark.query("q12", args)
    counts = (q.bids(ingestion_time=True).group_by(nexmark.column("bidder"), name="by_bidder")
              .window(TumblingWindows(SIZE_MS)).count(name="bid_count"))
    q.output(counts.map(nexmark.WindowRow("bidder", "bid_count"), name="q12"))
    return q.pipeline
