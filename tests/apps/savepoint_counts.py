"""Counts per user from a JetStream stream, in versions, for the savepoint tests.

    --stream EV --until N --output PATH [--version 1|2|3]

Version 2 changes the code of the ``format`` map (adds a field); version 3 renames the
``count`` step, so its state no longer matches a savepoint of version 1 or 2; version 4
is version 2 counting in 3 tasks instead of 2; version 5's ``by_user`` key fails on every
event (new code that fails on its first records).
"""

from __future__ import annotations

import argparse

from gearbus import Pipeline


def user(event: dict) -> str:
    return event["user"]


def user_v5(event: dict) -> str:
    raise KeyError(f"version 5 cannot key event {event['n']}")


def format_v1(result) -> dict:
    return {"user": result.key, "count": result.value}


def format_v2(result) -> dict:
    return {"user": result.key, "count": result.value, "format": 2}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="savepoint_counts")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--until", type=int, required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--version", type=int, choices=(1, 2, 3, 4, 5), default=1)
    opts = parser.parse_args(args)
    pipeline = Pipeline("savepoint-counts", parallelism=2, config={"checkpoint_interval_ms": 200})
    (pipeline.read_jetstream(opts.stream, until=opts.until, name="events")
        .group_by(user_v5 if opts.version == 5 else user, name="by_user", parallelism=3 if opts.version == 4 else None)
        .count(name="total" if opts.version == 3 else "count")
        .map(format_v1 if opts.version == 1 else format_v2, name="format")
        .write_jsonl(opts.output, name="write"))
    return pipeline
