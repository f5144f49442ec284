"""Running counts per user from a JetStream stream, for the replace tests: a row per event,
tagged with the version of the code that counted it.

    --stream EV --until N --output PATH [--version 1|2] [--event-time]

With --event-time an event's number is its event time (ms), else the stream's timestamp is.
"""

from __future__ import annotations

import argparse

from gearbus import Pipeline


def user(event: dict) -> str:
    return event["user"]


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="versioned_counts")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--until", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--version", type=int, choices=(1, 2), default=1)
    parser.add_argument("--event-time", action="store_true")
    opts = parser.parse_args(args)

    def count(seen, event):
        seen = (seen or 0) + 1
        return seen, {"user": event["user"], "n": event["n"], "count": seen, "version": opts.version}

    pipeline = Pipeline("versioned-counts", parallelism=2, config={"checkpoint_interval_ms": 200})
    (pipeline.read_jetstream(opts.stream, until=opts.until, name="events",
                             timestamp_fn=(lambda event: event["n"]) if opts.event_time else None)
        .group_by(user, name="by_user")
        .stateful_map(count, name="count")
        .write_jsonl(opts.output, name="write"))
    return pipeline
