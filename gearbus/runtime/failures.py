"""Whose a task's failure is, and what the user needs to find its cause.

An exception a task raises is the app's own (kind "user"): its code raised, or a
connector's input did (a missing file, a record the user's function rejects, a schema
error); it will raise again after a restore. Unless it is the cluster's (kind "fault"): the
data plane broke, a connection was lost or timed out, the worker's disk failed; a restore,
elsewhere perhaps, can repair that. The AppMaster's machine
(gearbus/runtime/appmaster_state.py) retries both, counts only faults against a worker,
and fails the app when a user error repeats identically after a restore. The report names
the step, the record (where there is one) and the innermost line of the traceback in the
user's own code, not gearbus's.
"""

from __future__ import annotations

import errno
import os
import sysconfig
import traceback

import nats.errors
import nats.js.errors

from gearbus.runtime.chain import StepError
from gearbus.runtime.core import DataPlaneError
from gearbus.runtime.state_backend import StateBackendError
from shared.messages import FRAMEWORK_PACKAGES, AppError, FailureKind
from shared.values import ValueTypeError

_SERVER_ERRORS = 500  # a JetStream API error with a code from this on: the server failed (a fault), not the request
#: The NATS connection broke or the server did not answer in time (in a step too: a sink's publish).
_NATS_FAULTS = (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
                nats.errors.ConnectionReconnectingError, nats.errors.NoServersError, nats.errors.StaleConnectionError,
                nats.errors.OutboundBufferLimitError, nats.errors.SlowConsumerError, nats.errors.FlushTimeoutError,
                nats.errors.TimeoutError, nats.js.errors.NoStreamResponseError)
#: The worker's disk failing (full, read-only, broken): another worker may do
_DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS})

_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Where code that is not the user's lives: gearbus's own packages, the standard library, installed packages.
_NOT_USERS = tuple(sorted({os.path.join(os.path.abspath(path), "") for path in (
    *(os.path.join(_ROOT, package) for package in FRAMEWORK_PACKAGES),
    *(sysconfig.get_paths()[name] for name in ("stdlib", "platstdlib", "purelib", "platlib")))}))


def failure_kind(exc: BaseException) -> str:
    """FailureKind.FAULT for what a restore can repair, else FailureKind.USER. Within a
    step (a StepError) only the data plane breaking or a NATS connection failing is a
    fault: a time-out, a lost connection or no responder to the user's own calls is the
    app's. A JetStream API error is the request's (a fault if the server failed); the
    state backend or the worker's disk failing is a fault, and so is an error raised from
    a NATS fault."""
    original = exc.original if isinstance(exc, StepError) else exc
    if isinstance(original, nats.js.errors.APIError):
        return FailureKind.FAULT if (original.code or 0) >= _SERVER_ERRORS else FailureKind.USER
    if isinstance(original, (DataPlaneError, StateBackendError, *_NATS_FAULTS)) \
            or isinstance(original, OSError) and original.errno in _DISK_ERRNOS or _raised_from_nats_fault(original):
        return FailureKind.FAULT
    if isinstance(exc, StepError):
        return FailureKind.USER
    return FailureKind.FAULT if isinstance(exc, (ConnectionError, TimeoutError, nats.errors.Error)) \
        else FailureKind.USER


def _raised_from_nats_fault(exc: BaseException) -> bool:
    """A connector's own error raised ``from`` a NATS time-out or lost connection (e.g. a
    JetStream API request that timed out, gearbus/connectors/jetstream.py) is that fault."""
    cause = exc.__cause__
    while cause is not None:
        if isinstance(cause, _NATS_FAULTS):
            return True
        cause = cause.__cause__
    return False


def user_location(exc: BaseException) -> str:
    """``file.py:line`` of the innermost frame of ``exc``'s traceback in the user's own
    code ("" if none: e.g. a connector's own error); a file in a package is named from the
    package's top, e.g. ``pkg/ops.py:12``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _users(f.filename)]
    if not frames:
        return ""
    path = os.path.abspath(frames[-1].filename)
    top = os.path.dirname(path)
    while os.path.exists(os.path.join(top, "__init__.py")):
        top = os.path.dirname(top)
    return f"{os.path.relpath(path, top)}:{frames[-1].lineno}"


def _users(filename: str) -> bool:
    return not filename.startswith("<") and not os.path.abspath(filename).startswith(_NOT_USERS)


def failure_report(exc: BaseException, context, kind: str = "") -> AppError:
    """What a user sees of a task's failure: the original exception type, the message
    (with the step and record for user code, the step for an unsendable value), the task,
    whose it is (``kind``, else :func:`failure_kind`), the step, the record, the user's
    line and the traceback. An exception with a ``step`` attribute names its step (a
    connector's); else a source task's failure is its first step's."""
    original = exc.original if isinstance(exc, StepError) else exc
    message = str(exc)
    steps = context.config.get("steps") or [context.processor_name]
    source = context.processor.data_source is not None and context.config.get("steps")
    step = getattr(exc, "step", None) or (steps[0] if source else context.processor_name)
    if isinstance(exc, ValueTypeError):
        emitted = getattr(exc, "emitted_by", None) or steps[-1:]
        message = f"{exc} (emitted by {'step' if len(emitted) == 1 else 'one of steps'} {', '.join(map(repr, emitted))})"
        step = emitted[-1]
    return AppError(
        error_type=type(original).__name__,
        message=message,
        where=f"task {context.task_name} of processor {context.processor_name!r}",
        traceback="".join(traceback.format_exception(exc)),
        kind=kind or failure_kind(exc),
        step=str(step),
        record=exc.record if isinstance(exc, StepError) else "",
        location=user_location(original),
    )
