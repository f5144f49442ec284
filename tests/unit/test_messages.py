"""The wire codec: round trips, defaults, and precise errors for bad input."""

import msgpack
import pytest

from shared.messages import (
    PROTOCOL_VERSION,
    AppError,
    ApplicationStatus,
    AppSummary,
    ErrorReply,
    FailureKind,
    KillApplication,
    ProtocolError,
    SubmitApplication,
    TaskCounters,
    TaskFailed,
    TaskId,
    decode,
)


def raw(**body) -> bytes:
    return msgpack.packb(body, use_bin_type=True)


def test_round_trip_with_nested_structs():
    status = ApplicationStatus(AppSummary(
        app_id=3, name="wc", state="FAILED", submitted_ms=1, error=AppError("ValueError", "bad", "task x"),
        tasks=[TaskCounters(TaskId(0, 1), records_in=5)],
    ))
    assert decode(status.encode()) == status


def test_wire_layout_is_a_map_with_type_and_version():
    body = msgpack.unpackb(KillApplication(7).encode())
    assert body == {"type": "KillApplication", "v": PROTOCOL_VERSION, "app_id": 7}


def test_missing_optional_fields_take_defaults_and_unknown_fields_are_ignored():
    message = decode(raw(type="SubmitApplication", v=1, name="a", artifact="x", entry="m", future_field=1))
    assert message == SubmitApplication(name="a", artifact="x", entry="m")


def test_a_task_failure_from_an_executor_that_predates_its_kind_decodes_with_empty_fields():
    """TaskFailed as an older executor sends it: no kind, step, record or location."""
    old = raw(type="TaskFailed", v=PROTOCOL_VERSION, executor_id=1, task={"processor": 3, "index": 1},
              error={"error_type": "ValueError", "message": "bad", "where": "task count[1]", "traceback": "..."},
              epoch=2, recoverable=False)
    failed = decode(old)
    assert failed.error == AppError("ValueError", "bad", "task count[1]", "...")
    assert (failed.error.kind, failed.error.step, failed.error.record, failed.error.location) == ("", "", "", "")
    new = AppError("ValueError", "bad", "task count[1]", "...", FailureKind.USER, "count", "'x'", "counts.py:12")
    assert decode(TaskFailed(1, TaskId(3, 1), new, 2).encode()).error == new


@pytest.mark.parametrize("data, expected", [
    (b"\xc1\xff garbage", "not valid msgpack"),
    (msgpack.packb([1, 2]), "expected a msgpack map"),
    (raw(v=1, app_id=1), 'no "type"'),
    (raw(type="NoSuchMessage", v=1), "unknown message type 'NoSuchMessage'"),
    (raw(type="KillApplication", v=99, app_id=1), "protocol version 99 is not supported"),
    (raw(type="KillApplication", v=1, app_id="7"), "KillApplication.app_id: expected an integer, got str"),
    (raw(type="KillApplication", v=1), "missing field(s) app_id"),
    (raw(type="KillApplication", v=1, app_id=True), "expected an integer, got bool"),
    (raw(type="SubmitApplication", v=1, name="a", artifact="x", entry="m", args=[1]), "args[0]: expected str"),
])
def test_bad_input_raises_a_protocol_error_naming_the_problem(data, expected):
    with pytest.raises(ProtocolError) as error:
        decode(data)
    assert expected in str(error.value)


def test_decode_can_insist_on_the_expected_types():
    with pytest.raises(ProtocolError, match="unexpected message type KillApplication; expected ErrorReply"):
        decode(KillApplication(1).encode(), (ErrorReply,))


def test_oversized_messages_are_refused():
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(b"\x00" * (9 * 1024 * 1024))
