"""Bad input in DSL pipelines on a real cluster: the app FAILS and its status names the
step, the exception and the offending record (or the file and line), as the TestRunner
does; a user error fails it on its second occurrence, after one restore, blaming no
worker. The tests share one cluster (each app's failure is its own)."""

from __future__ import annotations

import asyncio
import json
import re
import sys
import textwrap
import time


from gearbus.artifact import pack
from gearbus.client import Client
from shared.messages import AppState, AppSummary, FailureKind
from tests.support.paths import REPO

GEARBUS = [sys.executable, "-m", "gearbus.cli"]

RAISING_MAP = """
    from gearbus import Pipeline


    def divide(x):
        return 100 // (x - 42)


    def application(args):
        p = Pipeline("{name}")
        (p.from_collection(range(100), name="numbers")
            .map(divide, name="divide")
            .write_jsonl(args[0], name="write"))
        return p
"""

MALFORMED_JSON = """
    from gearbus import Pipeline


    def application(args):
        p = Pipeline("{name}", config={{"executors": 2}})
        (p.read_jsonl(args[0], parallelism=3, name="read")
            .map(lambda e: e["n"], name="number")
            .write_jsonl(args[1], name="write"))
        return p
"""

MISSING_INPUT = """
    from gearbus import Pipeline


    def application(args):
        p = Pipeline("{name}")
        p.read_jsonl(args[0], name="events").write_jsonl(args[1], name="write")
        return p
"""

UNSENDABLE = """
    from gearbus import Pipeline


    def application(args):
        p = Pipeline("{name}", config={{"executors": 1}}, parallelism=2)
        (p.from_collection(range(10), parallelism=2, name="numbers")
            .map(lambda x: {{x}}, name="to_set")
            .write_jsonl(args[0], name="write"))
        return p
"""


def write_app(tmp_path, name: str, template: str) -> str:
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(template.format(name=name)), encoding="utf-8")
    return str(path)


async def run_to_end(client: Client, path: str, args: list[str]) -> AppSummary:
    app_id = await client.submit(pack(path), args)
    final = await client.wait(app_id, timeout=60)
    assert final.state in AppState.TERMINAL
    return await client.status(app_id)


def write_lines(path, count: int, bad: int) -> None:
    lines = [json.dumps({"n": n, "text": "wörld"}, ensure_ascii=False) if n != bad else '{"n": %d,' % n
             for n in range(1, count + 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


async def gearbus(*args: str, timeout: float = 90) -> tuple[int, str, str]:
    process = await asyncio.create_subprocess_exec(*GEARBUS, *args, cwd=REPO, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(process.communicate(), timeout)
    return process.returncode, out.decode(), err.decode()


async def test_a_raising_map_fails_the_app_on_its_second_occurrence_naming_the_step_record_and_line(
        shared_client, shared_cluster, tmp_path):
    path = write_app(tmp_path, "raising_map", RAISING_MAP)
    app = await run_to_end(shared_client, path, [str(tmp_path / "out.jsonl")])
    assert app.state == AppState.FAILED
    error = app.error
    assert error is not None
    assert error.error_type == "ZeroDivisionError"
    assert error.message == "integer division or modulo by zero (step 'divide' on record 42)"
    assert error.where == "task numbers+divide+write[0] of processor 'numbers+divide+write'"
    assert "ZeroDivisionError" in error.traceback and "divide" in error.traceback
    assert (error.kind, error.step, error.record, error.location) == (FailureKind.USER, "divide", "42",
                                                                      "raising_map.py:6")
    assert app.restarts == 1 and app.blacklisted_workers == []  # one restore, then the same error: the app's

    code, out, err = await gearbus("status", "--nats", shared_cluster.url, str(app.app_id))
    assert code == 0, err
    assert f"app {app.app_id} (raising_map): FAILED" in out
    [line] = [x for x in out.splitlines() if x.strip().startswith("error")]
    assert line.startswith("  error in task numbers+divide+write[0] of processor 'numbers+divide+write': "
                           "ZeroDivisionError: ")
    assert line.endswith("integer division or modulo by zero (step 'divide' on record 42)")
    assert "    user error (the app's code or input: fix it, then submit again): step divide, at raising_map.py:6, " \
           "on record 42" in out.splitlines()
    assert "  restarts: 1 (rolled back to the last checkpoint)" in out.splitlines()
    code, out, err = await gearbus("status", "--json", "--nats", shared_cluster.url, str(app.app_id))
    shown = json.loads(out)
    assert (shown["error"]["kind"], shown["error"]["location"]) == ("user", "raising_map.py:6")
    assert [(t["task"], t["name"]) for t in shown["tasks"]] == [({"processor": 0, "index": 0},
                                                                 "numbers+divide+write[0]")]


async def test_a_missing_input_file_fails_the_app_on_its_second_occurrence_blaming_no_worker(shared_client,
                                                                                             tmp_path):
    path = write_app(tmp_path, "missing_input", MISSING_INPUT)
    missing = tmp_path / "absent.jsonl"
    started = time.monotonic()
    app = await run_to_end(shared_client, path, [str(missing), str(tmp_path / "out.jsonl")])
    print(f"missing input: submit to {app.state} in {time.monotonic() - started:.2f} s")  # measured, not asserted
    assert app.state == AppState.FAILED
    assert (app.error.error_type, app.error.kind, app.error.step) == ("FileNotFoundError", FailureKind.USER, "events")
    assert str(missing) in app.error.message
    assert app.restarts == 1 and app.blacklisted_workers == []


async def test_a_malformed_json_line_reports_file_and_line_number(shared_client, tmp_path):
    source = tmp_path / "events.jsonl"
    write_lines(source, 90, bad=71)  # in the third of three byte ranges
    path = write_app(tmp_path, "malformed_json", MALFORMED_JSON)
    app = await run_to_end(shared_client, path, [str(source), str(tmp_path / "out.jsonl")])
    assert app.state == AppState.FAILED
    assert app.error.error_type == "ValueError"
    assert app.error.message.startswith(f"{source}:71: not valid JSON (")
    assert "'{\"n\": 71,'" in app.error.message
    assert app.error.where == "task read+number[2] of processor 'read+number'"


async def test_an_unsendable_value_names_its_type_and_the_step(shared_client, tmp_path):
    # One executor: every edge is a local hand-over, so the outcome does not depend on placement.
    path = write_app(tmp_path, "unsendable", UNSENDABLE)
    app = await run_to_end(shared_client, path, [str(tmp_path / "out.jsonl")])
    assert app.state == AppState.FAILED
    assert app.error.error_type == "ValueTypeError"
    assert "a value of type builtins.set cannot be sent between tasks" in app.error.message
    assert "(emitted by step 'to_set')" in app.error.message


def error_line(stderr: str) -> str:
    """The ``gearbus run:`` line, without the app id (0 on the TestRunner)."""
    [line] = [x for x in stderr.splitlines() if x.startswith("gearbus run: ")]
    return re.sub(r"^gearbus run: app \d+ ", "gearbus run: app N ", line)


async def test_the_test_and_local_runners_print_the_same_error(tmp_path):
    path = write_app(tmp_path, "raising_cli", RAISING_MAP)
    results = {}
    for runner in ("test", "local"):
        code, _, err = await gearbus("run", "--runner", runner, "--log-dir", str(tmp_path / "logs"), path,
                                     str(tmp_path / f"out-{runner}.jsonl"))
        assert code == 1, err
        results[runner] = error_line(err)
    assert results["test"] == results["local"]
    line = results["test"]
    assert line.startswith("gearbus run: app N FAILED in task numbers+divide+write[0] of processor "
                           "'numbers+divide+write': ZeroDivisionError: ")
    assert line.endswith("integer division or modulo by zero (step 'divide' on record 42) [user error (the app's "
                         "code or input: fix it, then submit again): step divide, at raising_cli.py:6, on record 42]")


async def test_the_test_and_local_runners_print_the_same_json_error(tmp_path):
    source = tmp_path / "events.jsonl"
    write_lines(source, 30, bad=12)
    path = write_app(tmp_path, "malformed_cli", MALFORMED_JSON)
    results = {}
    for runner in ("test", "local"):
        code, out, err = await gearbus("run", "--json", "--runner", runner, "--log-dir", str(tmp_path / "logs"),
                                       path, str(source), str(tmp_path / f"out-{runner}.jsonl"))
        assert code == 1, err
        summary = json.loads(out)
        assert summary["state"] == AppState.FAILED
        results[runner] = (summary["error"]["error_type"], summary["error"]["message"])
    assert results["test"] == results["local"]
    assert results["test"][1].startswith(f"{source}:12: not valid JSON")
