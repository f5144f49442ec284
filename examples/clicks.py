"""An app that keeps running: each user's clicks counted as they arrive from a JetStream stream.

    gearbus submit examples/clicks.py --output clicks.jsonl [--stream CLICKS]

Reads the stream's subjects ``clicks.>`` (fed by examples/click_producer.py), keys the
clicks by user, keeps a running count per user (step ``count``, which ``gearbus state``
reads and ``gearbus rescale`` divides) and appends ``{"user": "u7", "clicks": 12,
"page": "/cart", "version": 1}`` per click to the output, exactly once whatever fails.
examples/clicks_v2.py is the next version of the same app, for ``gearbus replace``.
"""

from __future__ import annotations

import argparse

from gearbus import Pipeline


def count(clicks: int | None, click: dict) -> tuple[int, dict]:
    clicks = (clicks or 0) + 1
    return clicks, {"user": click["user"], "clicks": clicks, "page": click["page"], "version": 1}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="clicks")
    parser.add_argument("--output", required=True, help="JSON Lines file to append counts to")
    parser.add_argument("--stream", default="CLICKS", help="the JetStream stream to read (default %(default)s)")
    opts = parser.parse_args(args)
    pipeline = Pipeline("clicks", parallelism=2)
    (pipeline.read_jetstream(opts.stream, "clicks.>", timestamp_fn=lambda click: click["ts"], name="clicks")
        .group_by(lambda click: click["user"], name="by_user")
        .stateful_map(count, name="count")
        .write_jsonl(opts.output, name="write"))
    return pipeline
