"""What a worker reports as a launched process's last error line."""

from __future__ import annotations

import json

from services.worker.last_error import TAIL_BYTES, last_error_line


def event(level: str, name: str, **data) -> str:
    return json.dumps({"event": name, "level": level, "role": "appmaster", "timestamp": "t", **data})


def written(tmp_path, *lines: str) -> str:
    path = tmp_path / "process.log"
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def test_the_last_error_event_wins_over_earlier_ones_and_over_info(tmp_path):
    path = written(tmp_path, event("error", "first_failure", error="old"), event("info", "service_started"),
                   event("error", "service_start_failed", error="ConnectionError: refused",
                         exception="Traceback ...\nConnectionError: refused"),
                   event("info", "service_closed", exit_code=2))
    assert last_error_line(path) == "service_start_failed: ConnectionError: refused"


def test_an_error_event_without_an_error_field_shows_its_exception_or_its_data(tmp_path):
    assert last_error_line(written(tmp_path, event("error", "crashed", exception="Traceback\n  x\nKeyError: 'k'"))) \
        == "crashed: KeyError: 'k'"
    assert last_error_line(written(tmp_path, event("critical", "worker_gone", worker_pid=7))) == "worker_gone worker_pid=7"


def test_a_traceback_gives_its_final_line(tmp_path):
    path = written(tmp_path, event("error", "earlier", error="old"),
                   "Traceback (most recent call last):", '  File "app.py", line 3, in <module>',
                   "    raise ValueError('first')", "ValueError: first", "",
                   "During handling of the above exception, another exception occurred:", "",
                   "Traceback (most recent call last):", '  File "app.py", line 5, in <module>',
                   "    raise SystemError('no model file')", "SystemError: no model file", "a print after it")
    assert last_error_line(path) == "SystemError: no model file"


def test_no_error_no_file_and_a_long_output_are_handled(tmp_path):
    assert last_error_line(written(tmp_path, event("info", "service_started"), "plain output")) == ""
    assert last_error_line(str(tmp_path / "missing.log")) == ""
    long = written(tmp_path, event("error", "too_early", error="x"), "y" * TAIL_BYTES,
                   event("error", "late", error="z" * 5000))
    assert last_error_line(long) == "late: " + "z" * 994
