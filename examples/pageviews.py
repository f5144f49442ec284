"""Page views per member per 10-second window, with early results (Samza's example).

    gearbus run examples/pageviews.py --input events.jsonl --output counts.jsonl

Input lines: ``{"member": str, "page": str, "ts": epoch_ms}``. Records are partitioned by
member and counted in 10-second tumbling windows of event time. An early trigger fires
every 5 records of a (member, window), in discarding mode, so each row counts only what
arrived since the previous row; when the watermark passes the window's end, one final
row closes it (count 0 if nothing arrived since its last early row). The counts of all
rows of a window add up to its total. Output lines: ``{"member", "window_start",
"window_end", "count", "final"}`` with window bounds in epoch ms.
"""

from __future__ import annotations

import argparse
import os

from gearbus import Accumulation, Pipeline, Triggers, TumblingWindows, submitter_path

WINDOW_MS = 10_000
EARLY_EVERY = 5


def event_time(event: dict) -> int:
    return event["ts"]


def member(event: dict) -> str:
    return event["member"]


def row(result) -> dict:
    return {"member": result.key, "window_start": result.window_start, "window_end": result.window_end,
            "count": result.value, "final": result.final}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="pageviews")
    parser.add_argument("--input", required=True, help="JSON Lines page views")
    parser.add_argument("--output", required=True, help="JSON Lines window counts")
    parser.add_argument("--max-delay-ms", type=int, default=0,
                        help="how far out of order events may arrive (default 0)")
    parser.add_argument("--parallelism", type=int, default=2, help="counting tasks (default 2)")
    opts = parser.parse_args(args)
    if not os.path.isfile(submitter_path(opts.input)):
        parser.error(f"input file {opts.input} does not exist")
    pipeline = Pipeline("pageviews", parallelism=opts.parallelism)
    (pipeline.read_jsonl(opts.input, timestamp_fn=event_time,
                         max_out_of_orderness_ms=opts.max_delay_ms, name="read")
        .group_by(member, name="by_member")
        .window(TumblingWindows(WINDOW_MS), trigger=Triggers.repeat(Triggers.count(EARLY_EVERY)),
                accumulation=Accumulation.DISCARDING)
        .count(name="count")
        .map(row, name="format")
        .write_jsonl(opts.output, name="write"))
    return pipeline
