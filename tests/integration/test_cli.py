"""The gearbus command line, run as a user runs it: a real process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess

import nats
import pytest

from gearbus.artifact import pack
from gearbus.natsserver import free_port, wait_listening
from shared.messages import AppState
from tests.support.cli import GEARBUS, gearbus, gearbus_into_a_closed_pipe, gearbus_lines
from tests.support.cluster import wait_state
from tests.support.files import write_text
from tests.support.paths import APPS, REPO, TICKER, WORDCOUNT
from tests.support.ticker import read_ticks, wait_for_ticks
from tests.support.wordcount import expected_counts, read_counts, sample_lines


async def test_run_wordcount_on_the_embedded_default(tmp_path):
    source, output = tmp_path / "in.txt", tmp_path / "out.jsonl"
    write_text(source, sample_lines(2000))
    code, out, err = await gearbus("run", "--json", WORDCOUNT, "--input", str(source), "--output", str(output))
    assert code == 0, err
    assert json.loads(out)["state"] == AppState.SUCCEEDED
    assert "SUCCEEDED" in err
    assert read_counts(output) == expected_counts(source)


async def test_run_reports_a_failing_task_and_exits_non_zero(tmp_path):
    code, _, err = await gearbus("run", "--log-dir", str(tmp_path / "logs"), os.path.join(APPS, "failing.py"))
    assert code == 1
    assert "FAILED" in err and "ValueError: cannot handle record 42" in err
    assert f"logs kept in {tmp_path / 'logs'}" in err


async def test_bad_app_files_are_reported_before_anything_is_submitted(tmp_path):
    code, _, err = await gearbus("submit", "--nats", "nats://127.0.0.1:1", str(tmp_path / "missing.py"))
    assert code == 2 and "does not exist" in err
    code, _, err = await gearbus("run", os.path.join(APPS, "not_an_app.py"))
    assert code == 2 and "does not define application(args)" in err
    code, _, err = await gearbus("run", WORDCOUNT, "--input", str(tmp_path / "nope.txt"), "--output", "x")
    assert code == 2 and "nope.txt does not exist" in err


async def test_submit_status_list_kill_info_against_a_cluster(cluster, client):
    url = ["--nats", cluster.url]
    code, out, err = await gearbus("submit", *url, "--json", os.path.join(APPS, "endless.py"))
    assert code == 0, err
    app_id = json.loads(out)["app_id"]
    await wait_state(client, app_id, AppState.ACTIVE)

    code, out, _ = await gearbus("status", *url, "--json", str(app_id))
    assert code == 0 and json.loads(out)["state"] == AppState.ACTIVE
    code, out, _ = await gearbus("status", *url, str(app_id))
    assert f"app {app_id} (endless): ACTIVE" in out
    code, out, _ = await gearbus("list", *url, "--json")
    assert [a["app_id"] for a in json.loads(out)] == [app_id]
    code, out, _ = await gearbus("info", *url, "--json")
    assert sorted(w["worker_id"] for w in json.loads(out)["workers"]) == ["worker-0", "worker-1"]

    code, out, _ = await gearbus("kill", *url, str(app_id))
    assert code == 0 and "killed" in out
    code, out, _ = await gearbus("wait", *url, "--json", str(app_id))
    assert code == 1 and json.loads(out)["state"] == AppState.TERMINATED

    code, _, err = await gearbus("status", *url, "999")
    assert code == 1 and "unknown app id 999" in err


async def test_no_master_is_a_clear_error_within_the_deadline(nats_server):
    code, _, err = await gearbus("list", "--nats", nats_server.url, "--request-timeout", "1")
    assert code == 1 and "no master answered" in err


async def test_every_command_fails_fast_on_an_unreachable_nats_url():
    """A closed port, and a port that listens but does not speak NATS: one line naming the URL,
    exit 1, within 5 s. The runs overlap, but no more than two interpreters start up at once (a run
    against a silent port waits on it idle): more would slow start-up on 2 cores, past the 5 s."""
    commands = [["status", "1"], ["wait", "1"], ["list"], ["info"], ["kill", "1"], ["savepoint", "1"],
                ["submit", os.path.join(APPS, "endless.py")]]
    starting = asyncio.Semaphore(2)
    loop = asyncio.get_running_loop()

    async def fails_fast(command: list[str], listening: bool) -> None:
        up = asyncio.Event()  # the interpreter has started: it connected, or it is done
        silent = await asyncio.start_server(lambda reader, writer: up.set(), "127.0.0.1", 0)
        url = f"nats://127.0.0.1:{silent.sockets[0].getsockname()[1]}" if listening else "nats://127.0.0.1:1"
        async with silent:
            async with starting:
                started = loop.time()
                run = asyncio.create_task(gearbus(command[0], "--nats", url, *command[1:], timeout=20))
                run.add_done_callback(lambda _: up.set())
                await up.wait()
            code, out, err = await run
            took = loop.time() - started
        assert code == 1, (command, url, err)
        assert took < 5, f"{command} at {url} took {took:.1f} s"
        assert f"gearbus {command[0]}: " in err and url in err.splitlines()[-1] and not out, (command, url, out, err)

    runs = [(command, listening) for command in commands for listening in (False, True)]
    outcomes = await asyncio.gather(*(fails_fast(*run) for run in runs), return_exceptions=True)
    failures = [f"{command}, {'silent' if listening else 'closed'} port: {type(outcome).__name__}: {outcome}"
                for (command, listening), outcome in zip(runs, outcomes) if outcome is not None]
    assert not failures, "\n".join(failures)


async def test_restart_carries_a_running_app_on_from_a_savepoint_and_starts_an_ended_one_afresh(cluster, client,
                                                                                                tmp_path):
    ticks = tmp_path / "ticks.jsonl"
    url = ["--nats", cluster.url]
    first = await client.submit(pack(TICKER), ["--output", str(ticks), "--rate", "200"])
    await wait_state(client, first, AppState.ACTIVE)

    await wait_for_ticks(client, ticks, 100, 30)
    code, out, err = await gearbus("restart", *url, "--json", str(first))
    assert code == 0, err
    restarted = json.loads(out)
    second = restarted["app_id"]
    assert restarted["previous_app_id"] == first and restarted["from_savepoint"].startswith(f"restart-app{first}-")
    assert (await client.status(first)).state == AppState.TERMINATED
    await wait_state(client, second, AppState.ACTIVE)
    before = max(read_ticks(ticks))
    seen = await wait_for_ticks(client, ticks, before + 100, 30)
    assert sorted(seen) == list(range(max(seen) + 1)), "numbers lost or written twice across the restart"

    await client.kill(second)
    code, out, err = await gearbus("restart", *url, str(second))
    assert code == 0 and "afresh" in out, err
    third = int(out.split("as app ")[1].split(",")[0])
    await wait_state(client, third, AppState.ACTIVE)
    await client.kill(third)

    code, _, err = await gearbus("restart", *url, "999")
    assert code == 1 and "999" in err


async def test_arguments_an_app_rejects_on_the_cluster_report_the_parsers_message(client):
    """Submitted without the CLI's local check (any NATS client can): the AppMaster's error
    carries what argparse said, not only its exit code."""
    app_id = await client.submit(pack(WORDCOUNT), ["--input", "/nonexistent/words.txt", "--output", "x.jsonl"])
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.FAILED
    assert "application arguments rejected (exit code 2)" in final.error.message
    assert "input file /nonexistent/words.txt does not exist" in final.error.message
    assert "usage: wordcount" in final.error.message


async def test_logs_show_what_tasks_printed_from_any_machine(cluster, client, tmp_path):
    url = ["--nats", cluster.url]
    app_id = await client.submit(pack(os.path.join(APPS, "printing.py")), [str(tmp_path / "parity.jsonl"), "40"])
    assert (await client.wait(app_id, timeout=60)).state == AppState.SUCCEEDED

    code, out, err = await gearbus("logs", *url, str(app_id))
    assert code == 0, err
    assert all(f"map saw {n}\n" in out for n in range(40))
    assert f"/app{app_id}-appmaster0 <==" in out and "app_active" in out  # the AppMaster's log too

    status = await client.status(app_id)
    printer = next(t for t in status.tasks if t.task.processor == 0)
    other = next(t for t in status.tasks if t.executor_id != printer.executor_id)
    code, out, _ = await gearbus("logs", *url, "--task", "numbers+shout+parity.0", str(app_id))
    assert code == 0 and f"-executor{printer.executor_id} <==" in out and "map saw 39" in out
    code, out, _ = await gearbus("logs", *url, "--task", f"{other.task.processor}.{other.task.index}", str(app_id))
    assert code == 0 and "map saw" not in out and f"-executor{other.executor_id} <==" in out

    code, out, _ = await gearbus("logs", *url, "--json", "--task", "0.0", str(app_id))
    chunks = [json.loads(line) for line in out.splitlines()]
    assert {c["executor_id"] for c in chunks} == {printer.executor_id} and not any(c["running"] for c in chunks)

    code, _, err = await gearbus("logs", *url, "--task", "7.0", str(app_id))
    assert code == 1 and "has no task 7.0" in err


async def test_logs_follow_prints_lines_as_they_come_until_the_app_ends(cluster, client, tmp_path):
    app_id = await client.submit(pack(TICKER), ["--output", str(tmp_path / "ticks.jsonl"), "--rate", "50",
                                                "--count", "150"])
    await wait_state(client, app_id, AppState.ACTIVE)
    code, out, err = await gearbus("logs", "--nats", cluster.url, "--follow", str(app_id), timeout=60)
    assert code == 0, err
    assert (await client.status(app_id)).state == AppState.SUCCEEDED  # it returned once the app had ended
    assert "app_active" in out and f"/app{app_id}-executor0 <==" in out  # every process's log


async def test_top_shows_every_running_apps_processors_as_tables_or_json_and_a_closed_pipe_ends_quietly(cluster, client, tmp_path):
    app_id = await client.submit(pack(TICKER), ["--output", str(tmp_path / "ticks.jsonl"), "--rate", "100"])
    await wait_state(client, app_id, AppState.ACTIVE)
    names = []
    async with asyncio.timeout(30):
        while not names:  # metrics come with the AppMaster's heartbeats
            names = [p.name for p in (await client.status(app_id)).processors]
            await asyncio.sleep(0.2)
    code, out, err = await gearbus("top", "--nats", cluster.url, "--once")
    assert code == 0, err
    assert f"app {app_id} ticker: ACTIVE" in out and "back-pressure" in out
    assert all(name in out for name in names)

    code, out, err = await gearbus("top", "--nats", cluster.url, "--once", "--json")
    assert code == 0, err
    [app] = json.loads(out)["apps"]  # one document
    assert app["app_id"] == app_id and app["state"] == AppState.ACTIVE
    assert [p["name"] for p in app["processors"]] == names and all("records_in" in p for p in app["processors"])
    refreshes = [json.loads(line) for line in await gearbus_lines("top", "--nats", cluster.url, "--json", lines=2)]
    assert [[a["app_id"] for a in r["apps"]] for r in refreshes] == [[app_id], [app_id]]
    assert refreshes[0]["time_ms"] < refreshes[1]["time_ms"]
    [title] = await gearbus_lines("top", "--nats", cluster.url, lines=1)  # into a pipe: a table per refresh
    assert f"app {app_id} ticker: ACTIVE" in title

    # The reader of its output gone (| head -1): every command ends quietly, the live one too.
    for command in (["status", str(app_id)], ["list"], ["top"], ["top", "--json"], ["logs", str(app_id)]):
        code, err = await gearbus_into_a_closed_pipe(command[0], "--nats", cluster.url, *command[1:])
        assert (code, err) == (141, ""), (command, code, err)
    await client.kill(app_id)


def run_on_a_terminal(argv: list[str], timeout: float = 90) -> str:
    """Run ``argv`` with its stdout and stderr on a pseudo-terminal; return what it showed."""
    import pty
    import time

    master, slave = pty.openpty()
    process = subprocess.Popen(argv, cwd=REPO, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
                               env={**os.environ, "COLUMNS": "150", "TERM": "xterm"})
    os.close(slave)
    shown, deadline = b"", time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closed: the process ended
            break
        if not chunk:
            break
        shown += chunk
    process.wait(10)
    os.close(master)
    return shown.decode(errors="replace")


async def test_run_shows_progress_on_a_terminal_only(tmp_path):
    # 5 s of ticks: on a busy machine the app may be ACTIVE only seconds after its tasks began
    argv = [*GEARBUS, "run", TICKER, "--output", str(tmp_path / "ticks.jsonl"), "--rate", "100", "--count", "500"]
    shown = await asyncio.to_thread(run_on_a_terminal, argv)
    assert "app 1 ACTIVE" in shown and "read " in shown and "sunk " in shown, shown
    assert "SUCCEEDED" in shown
    code, out, err = await gearbus("run", TICKER, "--output", str(tmp_path / "again.jsonl"), "--rate", "100",
                                   "--count", "300")
    assert code == 0 and "read " not in err and "sunk " not in err and not out


@pytest.mark.parametrize("app", ["exits_on_import.py", "executors_cannot_load.py"])
async def test_status_shows_why_a_process_of_the_app_exited_at_start(cluster, client, app):
    """Not only its exit code: the last error line the process left (an AppMaster's, an executor's)."""
    app_id = await client.submit(pack(os.path.join(APPS, app)), config={"appmaster_restarts": 0})
    assert (await client.wait(app_id, timeout=60)).state == AppState.FAILED
    code, out, err = await gearbus("status", "--nats", cluster.url, str(app_id))
    assert code == 0, err
    assert "exited with code" in out and "no model file at /data/model.bin" in out, out


async def test_gearbus_nats_server_runs_the_installed_binary_from_a_shell_without_the_venv(tmp_path):
    """The cluster recipe's first line: PATH holds no nats-server, yet `gearbus nats-server -js`
    serves NATS with JetStream on the port given."""
    port = free_port()
    process = subprocess.Popen([*GEARBUS, "nats-server", "-js", "-a", "127.0.0.1", "-p", str(port), "-sd",
                                str(tmp_path)], cwd=REPO, env={**os.environ, "PATH": "/usr/bin:/bin"},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        await asyncio.to_thread(wait_listening, process, port, 30)
        nc = await nats.connect(f"nats://127.0.0.1:{port}")
        try:
            assert (await nc.jetstream().account_info()).limits is not None  # JetStream is on
        finally:
            await nc.close()
    finally:
        process.terminate()
        process.wait(10)
