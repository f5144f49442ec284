"""RateSource: consecutive integers split over tasks, bounded by count."""

import time

from gearbus import Processor
from gearbus.api.task import TaskContext
from gearbus.connectors.generator import RateSource


def drain(source: RateSource, parallelism: int) -> list[int]:
    processor = Processor.source(source, parallelism=parallelism)
    processor.id = 0
    seen = []
    for index in range(parallelism):
        task_source = RateSource(source.rate, source.count, source.value_fn)
        task_source.open(TaskContext(1, "t", processor, index, 0))
        while (batch := task_source.read(1000)) is not None:
            seen += [r.value for r in batch]
            if not batch:
                time.sleep(task_source.idle_wait_s())
    return seen


def test_every_number_once_across_tasks():
    assert sorted(drain(RateSource(1_000_000, count=5000), 3)) == list(range(5000))


def test_the_rate_is_kept():
    source = RateSource(2000, count=200)
    started = time.monotonic()
    assert drain(source, 1) == list(range(200))
    assert time.monotonic() - started >= 0.09  # 200 records at 2000/s take ~0.1 s
