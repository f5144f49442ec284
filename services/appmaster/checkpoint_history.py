"""The checkpoint coordinator's history as the protocol carries it to ``gearbus status``,
the REST API, ``/metrics`` and the dashboard: times on the wall clock, sizes per processor."""

from __future__ import annotations

import collections
from collections.abc import Iterable

from gearbus.runtime.checkpoints import CheckpointRecord as Record
from shared.messages import CheckpointRecord, ProcessorCheckpoint


def checkpoint_history(records: Iterable[Record], monotonic_now: float, wall_now: float) -> list[CheckpointRecord]:
    """``records`` (stamped with the monotonic clock the coordinator is fed) as messages
    stamped in epoch milliseconds, given both clocks read at one moment."""
    offset = wall_now - monotonic_now
    history = []
    for record in records:
        sizes, tasks = collections.Counter(), collections.Counter()
        for (processor, _), size in record.task_sizes:
            sizes[processor] += size
            tasks[processor] += 1
        history.append(CheckpointRecord(
            checkpoint_id=record.checkpoint_id, status=record.outcome.value,
            trigger_ms=int((record.started_at + offset) * 1000),
            duration_ms=int(record.duration_s * 1000) if record.duration_s is not None else 0,
            alignment_ms=int(record.alignment_s * 1000), size_bytes=record.size_bytes,
            processors=[ProcessorCheckpoint(processor, sizes[processor], tasks[processor]) for processor in sorted(sizes)],
            failure=record.failure))
    return history
