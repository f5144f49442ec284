"""Version 2 of examples/clicks.py: the same steps, its rows tagged with the new version.

    gearbus replace APP_ID count examples/clicks_v2.py --output clicks.jsonl [--stream CLICKS]

Only the code of the processor holding ``count`` changes: it keeps the counts version 1
made (the step keeps its name and kind) and tags its rows ``"version": 2``.
"""

from __future__ import annotations

import argparse

from gearbus import Pipeline


def count(clicks: int | None, click: dict) -> tuple[int, dict]:
    clicks = (clicks or 0) + 1
    return clicks, {"user": click["user"], "clicks": clicks, "page": click["page"], "version": 2}


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="clicks_v2")
    parser.add_argument("--output", required=True)
    parser.add_argument("--stream", default="CLICKS")
    opts = parser.parse_args(args)
    pipeline = Pipeline("clicks", parallelism=2)
    (pipeline.read_jetstream(opts.stream, "clicks.>", timestamp_fn=lambda click: click["ts"], name="clicks")
        .group_by(lambda click: click["user"], name="by_user")
        .stateful_map(count, name="count")
        .write_jsonl(opts.output, name="write"))
    return pipeline
