"""The stored formats: a task's snapshot envelope and a savepoint's record."""

import pickle

import pytest

from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.savepoints import SavepointRecord
from gearbus.runtime.snapshots import TaskSnapshot


def test_a_task_snapshot_survives_encoding():
    snapshot = TaskSnapshot(7, {"counts": {"a": 3}, "offset": (1, 2)}, True, WATERMARK_MAX)
    assert TaskSnapshot.decode(snapshot.encode()) == snapshot


def test_a_seeded_snapshot_starts_fresh_with_the_state():
    assert TaskSnapshot.seeded(1, {"x": 1}) == TaskSnapshot(1, {"x": 1}, False, WATERMARK_MIN)


def test_an_envelope_of_another_format_is_refused_clearly():
    old = pickle.dumps({"task": 3, "ended": False, "watermark": 0, "checkpoint_id": 2})
    with pytest.raises(ValueError, match="not a task snapshot of format"):
        TaskSnapshot.decode(old)


def test_a_savepoint_record_survives_plain_data():
    record = SavepointRecord("half", 3, "wordcount", 12, 1_700_000_000_000, {"count": 2, "read": 1})
    assert SavepointRecord.from_dict(record.to_dict()) == record
