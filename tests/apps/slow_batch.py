"""A pipeline whose map blocks its task's loop for --block-s seconds once (a slow call to
another service, say): slowness, which must not be mistaken for a dead executor."""

from __future__ import annotations

import argparse
import time

from gearbus import Pipeline


def application(args: list[str]) -> Pipeline:
    parser = argparse.ArgumentParser(prog="slow_batch")
    parser.add_argument("--output", required=True)
    parser.add_argument("--block-s", type=float, default=3.0)
    opts = parser.parse_args(args)

    def slow_once(n: int) -> int:
        if n == 500:
            time.sleep(opts.block_s)
        return n

    pipeline = Pipeline("slow-batch", config={"batch_records": 100})
    (pipeline.from_collection(range(1000), name="numbers")
        .map(slow_once, name="slow")
        .write_jsonl(opts.output, name="write"))
    return pipeline
