"""Whose a task's failure is, and what its report says: the TestRunner drives the
AppMaster's machine as the cluster does, so a user error fails the app on its second
occurrence, after one restore, naming the step, the record and the user's own line."""

from __future__ import annotations

import asyncio
import errno
import json

import nats.errors
import nats.js.errors
import pytest

from gearbus import CollectSink, Pipeline
from gearbus.runners import PipelineFailed, TestRunner
from gearbus.runtime.chain import StepError
from gearbus.runtime.core import DataPlaneError
from gearbus.runtime.failures import failure_kind, user_location
from gearbus.runtime.state_backend import StateBackendError
from shared.messages import FailureKind

pytestmark = pytest.mark.unit


@pytest.mark.parametrize("exc, kind", [
    (ValueError("bad"), FailureKind.USER),
    (FileNotFoundError(2, "No such file or directory"), FailureKind.USER),
    (PermissionError(13, "Permission denied"), FailureKind.USER),
    (StepError("parse", 7, ValueError("bad")), FailureKind.USER),
    (StepError("lookup", 3, TimeoutError("the user's call timed out")), FailureKind.USER),
    (nats.js.errors.NotFoundError(code=404, description="stream not found"), FailureKind.USER),
    (DataPlaneError("frame 7 lost"), FailureKind.FAULT),
    (StateBackendError("rocksdb state backend failed writing the state of step 'count'"), FailureKind.FAULT),
    (StepError("write", None, OSError(errno.ENOSPC, "No space left on device")), FailureKind.FAULT),
    (ConnectionResetError("reset"), FailureKind.FAULT),
    (asyncio.TimeoutError(), FailureKind.FAULT),
    (nats.errors.ConnectionClosedError(), FailureKind.FAULT),
    (StepError("out", None, nats.errors.TimeoutError()), FailureKind.FAULT),
    (StepError("customer", {"id": 1}, nats.errors.NoRespondersError()), FailureKind.USER),
    (nats.errors.NoRespondersError(), FailureKind.FAULT),  # a JetStream request while its server restarts
    (nats.js.errors.ServiceUnavailableError(code=503, description="jetstream unavailable"), FailureKind.FAULT),
])
def test_an_exception_is_the_apps_unless_the_cluster_broke(exc, kind):
    assert failure_kind(exc) == kind


def test_the_location_is_the_innermost_line_in_the_users_own_code():
    def users(value):
        return json.loads(value)  # the innermost frames are the standard library's

    try:
        users("{not json")
    except ValueError as exc:
        line = users.__code__.co_firstlineno + 1
        assert user_location(exc) == f"tests/unit/test_failures.py:{line}"  # named from its package's top


def test_a_user_function_raising_on_one_record_fails_the_app_on_its_second_occurrence(caplog):
    def parse(n):
        if n == 7:
            raise ValueError(f"cannot parse {n}")
        return n

    p = Pipeline("picky")
    p.from_collection(range(10), name="numbers").map(parse, name="parse").sink(CollectSink(), name="out")
    with pytest.raises(PipelineFailed) as failed:
        TestRunner().run(p)
    error = failed.value.error
    rollbacks = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rolling_back")]
    assert len(rollbacks) == 1 and "restarts=1" in rollbacks[0]  # one restore, then the same error fails the app
    assert (error.kind, error.step, error.record, error.error_type) == (FailureKind.USER, "parse", "7", "ValueError")
    assert error.location == f"tests/unit/test_failures.py:{parse.__code__.co_firstlineno + 2}"
    assert error.message == "cannot parse 7 (step 'parse' on record 7)"


def test_a_missing_input_file_is_a_user_error_of_the_source_step(tmp_path):
    missing = tmp_path / "absent.jsonl"
    p = Pipeline("missing")
    p.read_jsonl(str(missing), name="events").sink(CollectSink(), name="out")
    with pytest.raises(PipelineFailed) as failed:
        TestRunner().run(p)
    error = failed.value.error
    assert (error.kind, error.step, error.error_type) == (FailureKind.USER, "events", "FileNotFoundError")
    assert str(missing) in error.message and error.record == "" and error.location == ""


def test_a_sink_that_cannot_open_on_a_failing_disk_is_a_fault(tmp_path):
    from gearbus.connectors.files import unusable

    error = unusable(OSError(errno.EROFS, "Read-only file system"), "write", str(tmp_path / "out.jsonl"), "out",
                     type("Context", (), {"worker": "worker w1 (host h)"})())
    assert error.errno == errno.EROFS and failure_kind(error) == FailureKind.FAULT
    assert str(error) == f"step 'out' cannot write {tmp_path / 'out.jsonl'} on worker w1 (host h): Read-only file system"
    missing = unusable(FileNotFoundError(errno.ENOENT, "No such file or directory"), "read", "/x", "in",
                       type("Context", (), {"worker": ""})())
    assert isinstance(missing, FileNotFoundError) and failure_kind(missing) == FailureKind.USER


def test_a_jetstream_request_that_timed_out_is_a_fault():
    from gearbus.connectors.jetstream import JetStreamError, api

    class Silent:
        async def request(self, subject, payload, timeout):
            raise nats.errors.TimeoutError

    with pytest.raises(JetStreamError) as timed_out:
        asyncio.run(api(Silent(), "$JS.API.STREAM.INFO.EV", timeout=0.01))
    assert failure_kind(timed_out.value) == FailureKind.FAULT
    assert failure_kind(JetStreamError("$JS.API.STREAM.INFO.EV: stream not found (code 10059)")) == FailureKind.USER
