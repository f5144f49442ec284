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


def test_records_are_released_as_they_fall_due_not_all_at_once():
    processor = Processor.source(RateSource(1000, count=10_000))
    processor.id = 0
    source = RateSource(1000, count=10_000)
    source.open(TaskContext(1, "t", processor, 0, 0))
    assert len(source.read(100_000)) < 100  # at 1000/s, only the first few are due yet
    assert 0 < source.idle_wait_s() <= 0.001
