"""The coordinator's checkpoint history as users see it: on the wall clock, per processor,
and as ``gearbus status`` prints it."""

from __future__ import annotations

import pytest

from gearbus.cli import format_checkpoint_history
from gearbus.runtime.checkpoints import CheckpointRecord as Record
from gearbus.runtime.checkpoints import Outcome
from services.appmaster.checkpoint_history import checkpoint_history
from shared.messages import (ApplicationStatus, AppSummary, CheckpointRecord, CheckpointStats, ProcessorCheckpoint,
                             decode)

pytestmark = pytest.mark.unit


def test_records_are_stamped_on_the_wall_clock_and_summed_per_processor():
    records = [
        Record(7, 0, Outcome.COMPLETED, started_at=100.0, duration_s=0.25, alignment_s=0.0123,
               task_sizes=(((0, 0), 10), ((0, 1), 20), ((2, 0), 5))),
        Record(8, 0, Outcome.FAILED, started_at=101.0, duration_s=2.0, failure="declined by (2, 0): disk full"),
        Record(9, 1, Outcome.IN_PROGRESS, started_at=103.5, task_sizes=(((2, 0), 4),)),
    ]
    history = checkpoint_history(records, monotonic_now=104.0, wall_now=1_700_000_000.0)
    assert history == [
        CheckpointRecord(7, "completed", 1_699_999_996_000, 250, 12, 35,
                         [ProcessorCheckpoint(0, 30, 2), ProcessorCheckpoint(2, 5, 1)]),
        CheckpointRecord(8, "failed", 1_699_999_997_000, 2000, 0, 0, [], "declined by (2, 0): disk full"),
        CheckpointRecord(9, "in_progress", 1_699_999_999_500, 0, 0, 4, [ProcessorCheckpoint(2, 4, 1)]),
    ]


def test_the_history_crosses_the_wire_whole():
    stats = CheckpointStats(interval_ms=1000, history=checkpoint_history(
        [Record(1, 0, Outcome.COMPLETED, 5.0, 1.0, 0.5, (((1, 0), 3),))], 10.0, 1000.0))
    message = ApplicationStatus(AppSummary(1, "app", "ACTIVE", 0, checkpoints=stats))
    assert decode(message.encode()) == message


def test_status_lists_the_newest_checkpoint_first_with_what_became_of_each():
    history = checkpoint_history([
        Record(3, 0, Outcome.COMPLETED, 1.0, 0.2, 0.05, (((0, 0), 100),)),
        Record(4, 0, Outcome.FAILED, 2.0, 30.0, failure="timeout after 30s"),
        Record(5, 0, Outcome.IN_PROGRESS, 3.0),
    ], 3.0, 1_700_000_000.0)
    lines = format_checkpoint_history(history)
    assert [line.split()[:2] for line in lines] == [["#5", "in"], ["#4", "failed"], ["#3", "completed"]]
    assert "took" not in lines[0]
    assert lines[1].endswith("took 30000 ms, aligned 0 ms, 0 bytes: timeout after 30s")
    assert lines[2].endswith("took 200 ms, aligned 50 ms, 100 bytes")
