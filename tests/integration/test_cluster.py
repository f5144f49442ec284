"""The submission flow end to end on real processes and a real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import signal

import pytest

from gearbus.artifact import pack
from gearbus.client import Client
from gearbus.cluster import LocalCluster, children_of, launched_by
from gearbus.natsserver import NatsServer
from shared import subjects
from shared.bus import RemoteError
from shared.messages import AppState, ErrorCode, RegisterExecutor, RequestResource
from tests.support.cluster import wait_exited, wait_for_workers, wait_state, wait_until
from tests.support.files import write_text
from tests.support.paths import APPS, WORDCOUNT
from tests.support.wordcount import expected_counts, read_counts, sample_lines


async def run_wordcount(client: Client, tmp_path, lines: list[str], parallelism: int = 2, *extra: str) -> None:
    source, output = tmp_path / "input.txt", tmp_path / "counts.jsonl"
    write_text(source, lines)
    app_id = await client.submit(pack(WORDCOUNT), ["--input", str(source), "--output", str(output),
                                                   "--parallelism", str(parallelism), *extra])
    app = await client.wait(app_id, timeout=60)
    assert app.state == AppState.SUCCEEDED, app.error
    assert read_counts(output) == expected_counts(source)


async def test_wordcount_counts_exactly_on_two_workers(client, tmp_path):
    lines = sample_lines(5000) + ["", "   ", "\ttabs\tand  spaces ", ""]
    await run_wordcount(client, tmp_path, lines, 3, "--combine-keys", "40")  # many partial sums per word
    status = await client.list()
    assert [a.state for a in status] == [AppState.SUCCEEDED]


async def test_wordcount_with_lines_larger_than_a_nats_message(tmp_path):
    """Lines longer than the server's max_payload travel as fragmented frames."""
    small = NatsServer(store_dir=str(tmp_path / "js"), max_payload=64 * 1024)
    os.makedirs(small.store_dir)
    with small, LocalCluster(workers=2, log_dir=str(tmp_path / "logs"), nats=small) as cluster:
        async with Client(cluster.url, timeout=30) as client:
            await wait_for_workers(client, 2)
            huge = " ".join(f"long{i % 977}" for i in range(60_000))  # ~500 KB on one line
            await run_wordcount(client, tmp_path, [huge, "", *sample_lines(200), huge[:70_000]], parallelism=2)


async def test_wordcount_on_an_empty_file(client, tmp_path):
    await run_wordcount(client, tmp_path, [], parallelism=2)


async def test_an_app_shipped_as_a_package(client, tmp_path):
    output = tmp_path / "squares.jsonl"
    app_id = await client.submit(pack(os.path.join(APPS, "squares")), [str(output), "1000"])
    app = await client.wait(app_id, timeout=30)
    assert app.state == AppState.SUCCEEDED, app.error
    assert sorted(json.loads(line) for line in output.read_text().splitlines()) == [i * i for i in range(1000)]


async def test_status_list_and_kill_of_a_running_app(client):
    app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
    await wait_state(client, app_id, AppState.ACTIVE)
    status = await client.status(app_id)
    assert status.name == "endless" and status.appmaster_worker.startswith("worker-")
    assert [a.app_id for a in await client.list()] == [app_id]
    await client.kill(app_id)
    final = await client.wait(app_id, timeout=10)
    assert final.state == AppState.TERMINATED
    with pytest.raises(RemoteError) as refused:
        await client.kill(app_id)
    assert refused.value.code == ErrorCode.CONFLICT and "already ended" in refused.value.message


async def test_killed_app_releases_its_processes_and_slots(cluster, client):
    app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
    await wait_state(client, app_id, AppState.ACTIVE)
    workers = [p.pid for p in cluster.workers.values()]
    app_processes = [pid for w in workers for pid, _ in launched_by(w)]
    assert len(app_processes) == 3  # the AppMaster and two executors
    await client.kill(app_id)
    for pid in app_processes:
        await wait_exited(pid, timeout=15)
    assert all(not launched_by(w) for w in workers)


async def test_a_raising_task_fails_the_app_with_its_error_visible(client):
    app_id = await client.submit(pack(os.path.join(APPS, "failing.py")))
    app = await client.wait(app_id, timeout=30)
    assert app.state == AppState.FAILED
    assert app.error.error_type == "ValueError"
    assert app.error.message == "cannot handle record 42"
    assert "picky" in app.error.where
    assert "raise ValueError" in app.error.traceback


async def test_garbage_on_a_task_inbox_is_dropped_and_counted(client):
    app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
    await wait_state(client, app_id, AppState.ACTIVE)
    for garbage in (b"", b"\x00not msgpack", b"\x07"):
        await client.bus.nc.publish(subjects.task_inbox(app_id, 1, 0), garbage)

    async def dropped_three():
        status = await client.status(app_id)
        counted = {(c.task.processor, c.task.index): c.messages_dropped for c in status.tasks}
        return status if counted.get((1, 0)) == 3 else None

    status = await wait_until(client, subjects.appmaster_heartbeat("*"), dropped_three, timeout=20)
    assert status.state == AppState.ACTIVE
    await client.kill(app_id)


async def test_status_shows_the_application_clock_and_names_stalled_tasks(client):
    app_id = await client.submit(pack(os.path.join(APPS, "stalling.py")))

    async def stalled():
        status = await client.status(app_id)
        return status if status.stalled_tasks else None

    status = await wait_until(client, subjects.appmaster_heartbeat("*"), stalled)
    assert status.stalled_tasks == ["discard[0]", "merge[0]"]  # both receive records, neither moves on
    assert status.clock == -1  # the idle source's watermark: its one record was at event time 0
    await client.kill(app_id)


async def test_duplicate_executor_id_is_refused_with_a_reason(client):
    app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
    await wait_state(client, app_id, AppState.ACTIVE)
    with pytest.raises(RemoteError) as refused:
        await client.bus.request(subjects.appmaster_executor_register(app_id),
                                 RegisterExecutor(app_id, 0, "worker-x", 12345))
    assert refused.value.code == ErrorCode.CONFLICT
    assert "already registered" in refused.value.message and "12345" in refused.value.message
    await client.kill(app_id)


async def test_unknown_app_and_worker_ids_get_clear_errors(client):
    with pytest.raises(RemoteError) as unknown_app:
        await client.status(999)
    assert unknown_app.value.code == ErrorCode.NOT_FOUND and "999" in unknown_app.value.message
    with pytest.raises(RemoteError) as unknown_kill:
        await client.kill(999)
    assert unknown_kill.value.code == ErrorCode.NOT_FOUND
    app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
    with pytest.raises(RemoteError) as unknown_worker:
        await client.bus.request(subjects.resource_request(app_id),
                                 RequestResource(app_id, 1, placement="worker", worker_id="no-such-worker"))
    assert unknown_worker.value.code == ErrorCode.NOT_FOUND and "no-such-worker" in unknown_worker.value.message
    await client.kill(app_id)


@pytest.mark.parametrize("stop_signal", [signal.SIGKILL, signal.SIGTERM])
async def test_stopping_a_worker_leaves_no_child_processes(cluster, client, stop_signal):
    app_id = await client.submit(pack(os.path.join(APPS, "endless.py")))
    await wait_state(client, app_id, AppState.ACTIVE)
    workers = [p for p in cluster.workers.values() if launched_by(p.pid)]
    assert workers, "the app's processes run under some worker"
    victim = workers[0]
    children = children_of(victim.pid) + [pid for pid, _ in launched_by(victim.pid)]  # its fork server's too
    victim.send_signal(stop_signal)
    await wait_exited(victim.pid, timeout=15)
    for pid in children:
        await wait_exited(pid, timeout=15)
    assert all(not os.path.exists(f"/proc/{pid}") or _is_zombie(pid) for pid in children)


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def test_master_info_lists_workers_and_slots(client):
    info = await client.info()
    assert info.leader == "master-0" and info.masters == ["master-0"]
    assert sorted(w.worker_id for w in info.workers) == ["worker-0", "worker-1"]
    assert all(w.slots == 4 and w.slots_used == 0 and w.alive for w in info.workers)


async def test_a_kill_during_submission_answers_the_submitter_conflict(cluster_factory):
    """As docs/protocol.md says: the submission waits for a slot, the app is killed, and the
    submitter learns its app was killed (not that it could not start); it gets no AppMaster
    when the slot comes."""
    made = cluster_factory(workers=0)
    async with Client(made.url, timeout=60) as client:
        submitting = asyncio.create_task(client.submit(pack(os.path.join(APPS, "endless.py"))))
        async with asyncio.timeout(30):
            while (app_id := await pending_app(client)) is None:
                await asyncio.sleep(0.1)
        await client.kill(app_id)
        made.start_worker("worker-0")  # the slot the submission waited for
        with pytest.raises(RemoteError) as killed:
            await submitting
        assert killed.value.code == ErrorCode.CONFLICT and not killed.value.retryable
        assert killed.value.message == f"app {app_id} was killed while starting"
        assert (await client.status(app_id)).state == AppState.TERMINATED


async def pending_app(client: Client) -> int | None:
    return next((app.app_id for app in await client.list() if app.state == AppState.PENDING), None)


async def test_an_unknown_state_backend_is_refused_when_the_app_is_submitted(client, tmp_path):
    """Named in the submission: the master refuses it; in the app's own config: its
    AppMaster fails the app before any task runs."""
    app = pack(os.path.join(APPS, "squares"))
    with pytest.raises(RemoteError) as refused:
        await client.submit(app, [str(tmp_path / "squares.jsonl"), "10"], config={"state_backend": "lmdb"})
    assert refused.value.code == ErrorCode.BAD_REQUEST
    assert "state_backend must be one of memory, rocksdb, got 'lmdb'" in refused.value.message
    app_id = await client.submit(pack(os.path.join(APPS, "keyed_counts.py")), [
        "10", str(tmp_path / "counts.jsonl"), "1", "disk"])
    final = await client.wait(app_id, timeout=30)
    assert final.state == AppState.FAILED and final.error.error_type == "ConfigError"
    assert "state_backend must be one of memory, rocksdb, got 'disk'" in final.error.message
