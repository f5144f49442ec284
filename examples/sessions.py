"""User sessions: a user's events belong to one session until 30 seconds pass without one.

    gearbus run examples/sessions.py --input clicks.jsonl --output sessions.jsonl [--gap-ms 30000]

Input lines: ``{"user": str, "page": str, "ts": epoch_ms}``. Output lines: ``{"user",
"session_start", "session_end", "events", "pages"}`` where the session spans from its
first event to its last event plus the gap, and ``pages`` lists the distinct pages seen.
"""

from __future__ import annotations

import argparse
import os

from gearbus import AggregateFunction, Pipeline, SessionWindows, submitter_path


def event_time(event: dict) -> int:
    return event["ts"]


def user(event: dict) -> str:
    return event["user"]


def add(acc, event):
    acc[0] += 1
    if event["page"] not in acc[1]:
        acc[1].append(event["page"])
    return acc


def merge(a, b):
    return [a[0] + b[0], a[1] + [p for p in b[1] if p not in a[1]]]


SESSION = AggregateFunction(create=lambda: [0, []], add=add, merge=merge,
                            result=lambda acc: {"events": acc[0], "pages": sorted(acc[1])})


def row(result) -> dict:
    return {"user": result.key, "session_start": result.window_start, "session_end": result.window_end,
            **result.value}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="sessions")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--gap-ms", type=int, default=30_000, help="inactivity that ends a session")
    parser.add_argument("--max-delay-ms", type=int, default=0)
    parser.add_argument("--parallelism", type=int, default=2)
    opts = parser.parse_args(args)
    if not os.path.isfile(submitter_path(opts.input)):
        parser.error(f"input file {opts.input} does not exist")
    pipeline = Pipeline("sessions", parallelism=opts.parallelism)
    (pipeline.read_jsonl(opts.input, timestamp_fn=event_time,
                         max_out_of_orderness_ms=opts.max_delay_ms, name="read")
        .group_by(user, name="by_user")
        .window(SessionWindows(opts.gap_ms))
        .aggregate(SESSION, name="session")
        .map(row, name="format")
        .write_jsonl(opts.output, name="write"))
    return pipeline
