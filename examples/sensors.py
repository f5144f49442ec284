"""Average temperature per sensor per minute of event time, with late readings.

    gearbus run examples/sensors.py --input readings.jsonl --output averages.jsonl \\
        [--max-delay-ms 5000] [--allowed-lateness-ms 30000] [--late-output late.jsonl]

Input lines: ``{"sensor": str, "temp": float, "ts": epoch_ms}``, arriving out of order.
The watermark trails the newest reading by ``--max-delay-ms``; a minute's average is
written when the watermark passes its end. A reading up to ``--allowed-lateness-ms``
behind that updates the window and writes a corrected row ("timing": "late"; rows carry
everything so far, so the latest row of a window is its answer); a reading
later still is dropped, counted in the task counters (``gearbus status``) and, with
``--late-output``, written there. Output lines: ``{"sensor", "window_start",
"window_end", "avg", "count", "timing"}``.
"""

from __future__ import annotations

import argparse
import os

from gearbus import Accumulation, AggregateFunction, JsonLinesSink, Pipeline, TumblingWindows, submitter_path

MINUTE_MS = 60_000


def event_time(reading: dict) -> int:
    return reading["ts"]


def sensor(reading: dict) -> str:
    return reading["sensor"]


def start(acc, reading):
    return [acc[0] + reading["temp"], acc[1] + 1]


def merge(a, b):
    return [a[0] + b[0], a[1] + b[1]]


def average(acc) -> dict:
    return {"avg": round(acc[0] / acc[1], 6) if acc[1] else None, "count": acc[1]}


MEAN_TEMPERATURE = AggregateFunction(create=lambda: [0.0, 0], add=start, merge=merge, result=average)


def row(result) -> dict:
    return {"sensor": result.key, "window_start": result.window_start, "window_end": result.window_end,
            **result.value, "timing": result.timing}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="sensors")
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--max-delay-ms", type=int, default=5_000)
    parser.add_argument("--allowed-lateness-ms", type=int, default=30_000)
    parser.add_argument("--late-output", default=None, help="write readings too late to count here")
    parser.add_argument("--parallelism", type=int, default=2)
    parser.add_argument("--batch-records", type=int, default=4096,
                        help="readings the source reads at a time; the watermark advances after each batch")
    opts = parser.parse_args(args)
    if not os.path.isfile(submitter_path(opts.input)):
        parser.error(f"input file {opts.input} does not exist")
    late_sink = JsonLinesSink(opts.late_output) if opts.late_output else None
    pipeline = Pipeline("sensors", config={"batch_records": opts.batch_records}, parallelism=opts.parallelism)
    (pipeline.read_jsonl(opts.input, timestamp_fn=event_time,
                         max_out_of_orderness_ms=opts.max_delay_ms, name="read")
        .group_by(sensor, name="by_sensor")
        .window(TumblingWindows(MINUTE_MS), accumulation=Accumulation.ACCUMULATING,
                allowed_lateness_ms=opts.allowed_lateness_ms, late_sink=late_sink)
        .aggregate(MEAN_TEMPERATURE, name="average")
        .map(row, name="format")
        .write_jsonl(opts.output, name="write"))
    return pipeline
