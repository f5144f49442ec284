"""Nexmark Q11, user sessions: how many bids each bidder made per session, a session ending
after 10 s without a bid.

    gearbus run [--runner test|local|cluster|spark] examples/nexmark/q11.py --events 100000 --output q11.jsonl

Output rows: ``{"bidder", "bid_count", "starttime", "endtime"}``; a session spans from its first
bid to its last bid + 10 s (epoch ms). Bids exactly 10 s apart are one session, as in Flink.
"""

from __future__ import annotations

from gearbus import SessionWindows, nexmark

GAP_MS = 10_000


def application(args: list[str]):
    q = nexmark.query("q11", args)
    sessions = (q.bids().group_by(nexmark.column("bidder"), name="by_bidder").window(SessionWindows(GAP_MS))
                .count(name="bid_count"))
    q.output(sessions.map(nexmark.WindowRow("bidder", "bid_count"), name="q11"))
    return q.pipeline
