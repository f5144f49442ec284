"""The last error line in a launched process's output, for the report of its exit: a user
whose AppMaster or executor died early learns why from `gearbus status`, not only the
exit code.

Processes log structlog JSON lines; what Python prints itself (an exception nobody caught,
a failure before logging is set up) is a traceback. So an error line is an error event,
rendered as ``event: error``, or the final line of a traceback (``ValueError: ...``)."""

from __future__ import annotations

import json
import os

TAIL_BYTES = 64 * 1024  # how much of the end of the output is searched
MAX_CHARS = 1000  # a longer line is cut: it travels in a message and shows in a terminal
ERROR_LEVELS = ("error", "critical", "exception")
CONTEXT_KEYS = {"event", "level", "timestamp", "role", "node_id", "app_id", "executor_id", "task_id", "exception",
                "exc_info", "logger"}
TRACEBACK_START = "Traceback (most recent call last):"


def last_error_line(path: str) -> str:
    """The last error line in the file at ``path`` ("" when there is none or no file)."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(size - TAIL_BYTES, 0))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return ""
    if size > TAIL_BYTES:
        lines = lines[1:]  # the first is cut
    found, in_traceback = "", False
    for line in lines:
        if line.startswith(TRACEBACK_START):
            in_traceback = True
        elif in_traceback and line.strip() and not line[0].isspace():
            in_traceback = False
            found = line.strip()
        elif line.startswith("{"):
            found = _error_event(line) or found
    return found[:MAX_CHARS]


def _error_event(line: str) -> str:
    try:
        event = json.loads(line)
    except ValueError:
        return ""
    if not isinstance(event, dict) or event.get("level") not in ERROR_LEVELS:
        return ""
    name = str(event.get("event", ""))
    if "error" in event:
        return f"{name}: {event['error']}"
    exception = str(event.get("exception", "")).strip()
    if exception:
        return f"{name}: {exception.splitlines()[-1]}"
    details = " ".join(f"{k}={v}" for k, v in event.items() if k not in CONTEXT_KEYS)
    return f"{name} {details}".strip()
