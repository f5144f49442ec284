"""The checkpoint benchmark's pipelines, over a JetStream stream of JSON events
``{"id": n, "user": "u<k>", "ts": ms}`` (bench/checkpoints.py fills it).

    --stream EV --mode window --windows-subject SUBJECT [--window-ms 10000] [--parallelism 2]
    --stream EV --mode source [--parallelism 2]

``window``: read_jetstream(until="now") -> group_by(user) -> tumbling-window count ->
{"user", "start", "count"} -> write_jetstream(SUBJECT) (exactly-once, committed at
checkpoints; the stream capturing SUBJECT must exist).

``source``: read_jetstream(until="now") -> a filter that drops every event -> a sink that
discards: what the source tasks alone read, decode and stamp per second.

Checkpointing is set by the submitter (app config ``checkpoint_interval_ms``).
"""

from __future__ import annotations

import argparse

from gearbus import DataSink, Pipeline, TumblingWindows


def user(event: dict) -> str:
    return event["user"]


def event_time(event: dict) -> int:
    return event["ts"]


def window_row(result) -> dict:
    return {"user": result.key, "start": result.window_start, "count": result.value}


def nothing(event: dict) -> bool:
    return False


class Discard(DataSink):
    """Drops whatever it gets (nothing, behind the filter). Transactional with nothing to
    commit, so the pipeline stays exactly-once like the windowed one."""

    transactional = True

    def write(self, records) -> None:
        pass


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="checkpoint_app")
    parser.add_argument("--stream", required=True)
    parser.add_argument("--mode", choices=("window", "source"), default="window")
    parser.add_argument("--windows-subject", help="where window counts go (mode window)")
    parser.add_argument("--window-ms", type=int, default=10_000)
    parser.add_argument("--parallelism", type=int, default=2)
    opts = parser.parse_args(args)
    pipeline = Pipeline(f"checkpoint-bench-{opts.mode}", parallelism=opts.parallelism,
                        config={"executors": opts.parallelism})
    events = pipeline.read_jetstream(opts.stream, until="now", timestamp_fn=event_time, name="events")
    if opts.mode == "source":
        events.filter(nothing, name="drop_all").sink(Discard(), parallelism=opts.parallelism, name="discard")
        return pipeline
    if not opts.windows_subject:
        parser.error("--windows-subject is required with --mode window")
    (events.group_by(user, name="by_user")
        .window(TumblingWindows(opts.window_ms))
        .count(name="per_window")
        .map(window_row, name="window_row")
        .write_jetstream(opts.windows_subject, name="windows_out"))
    return pipeline
