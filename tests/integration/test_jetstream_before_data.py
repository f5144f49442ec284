"""An app whose JetStream stream holds no message yet starts, waits and reads what arrives,
exactly once, on a real cluster: subjects that appear one by one while it runs are each
read by one source task, also across the SIGKILL of an executor and a rescale of the
source. Only a stream that does not exist is refused at submit, before an app exists."""

from __future__ import annotations

import pytest
import pytest_asyncio

from gearbus.connectors.jetstream import ensure_stream_async
from shared import subjects
from shared.messages import AppState, AppSummary
from tests.support.cli import gearbus
from tests.support.cluster import kill_an_executor_after_a_checkpoint, wait_state, wait_until
from tests.support.user_counts import APP, EVENTS, args, counts, expected_counts, publish, read_at_least

pytestmark = pytest.mark.timeout(150)

PHASE = EVENTS // 3  # events on each subject: ev.1, then ev.2, then ev.3


@pytest_asyncio.fixture
async def empty_stream(shared_client):
    """Stream EV (subjects ev.*), created without a message; removed after the test."""
    nc = shared_client.bus.nc
    await ensure_stream_async(nc, "EV", ["ev.*"], 120, "file")
    yield
    await nc.jsm().delete_stream("EV")


async def started(client, url: str, output) -> int:
    """The app submitted as a user submits it (`gearbus submit`, which checks its sources
    first) and ACTIVE: its id."""
    code, out, err = await gearbus("submit", "--nats", url, APP, *args(output, 1))
    assert code == 0, err
    app_id = int(out.split()[-1])
    await wait_state(client, app_id, AppState.ACTIVE)
    return app_id


async def ended_exactly(client, app_id: int, output) -> AppSummary:
    """The app's final summary, once it succeeded with every event counted once."""
    final = await client.wait(app_id, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert counts(output) == expected_counts()
    return final


async def source_reads(client, app_id: int) -> dict[int, int]:
    return {t.task.index: t.records_in for t in (await client.status(app_id)).tasks if t.task.processor == 0}


async def test_an_app_on_an_empty_stream_reads_subjects_as_they_appear_exactly_once(
        shared_cluster, shared_client, empty_stream, tmp_path):
    url, client, output = shared_cluster.url, shared_client, tmp_path / "counts.jsonl"
    app = await started(client, url, output)
    checkpoint = 0
    for phase in range(3):  # ev.1, then ev.2, then ev.3: each new while the app runs
        await publish(url, phase * PHASE, (phase + 1) * PHASE, first_subject=phase + 1)
        if phase < 2:
            checkpoint = await read_at_least(client, app, (phase + 1) * PHASE, after_checkpoint=checkpoint)
            if phase == 1:
                assert all(read > 0 for read in (await source_reads(client, app)).values())  # both tasks own one
    await ended_exactly(client, app, output)


async def test_subjects_that_appear_around_a_recovery_are_read_exactly_once(
        shared_cluster, shared_client, empty_stream, tmp_path):
    url, client, output = shared_cluster.url, shared_client, tmp_path / "counts.jsonl"
    app = await started(client, url, output)
    await publish(url, 0, PHASE, first_subject=1)
    checkpoint = await read_at_least(client, app, PHASE)
    await kill_an_executor_after_a_checkpoint(shared_cluster, client, app, checkpoints=checkpoint + 1)
    await publish(url, PHASE, 2 * PHASE, first_subject=2)  # while the app recovers

    async def recovered():
        status = await client.status(app)
        return status.restarts >= 1 and status.checkpoints.last_id > checkpoint + 1

    await wait_until(client, subjects.checkpoint_complete(app), recovered, timeout=60)
    await publish(url, 2 * PHASE, EVENTS, first_subject=3)  # after it
    assert (await ended_exactly(client, app, output)).restarts >= 1


async def test_a_rescaled_source_reads_the_subjects_it_had_and_those_that_appear_after_exactly_once(
        shared_cluster, shared_client, empty_stream, tmp_path):
    url, client, output = shared_cluster.url, shared_client, tmp_path / "counts.jsonl"
    app = await started(client, url, output)
    await publish(url, 0, EVENTS // 2, subjects=2, first_subject=1)  # ev.1 and ev.2
    await read_at_least(client, app, EVENTS // 4)
    done = await client.rescale(app, {"events": 3})
    assert done.epoch == 1
    await publish(url, EVENTS // 2, EVENTS, subjects=2, first_subject=3)  # ev.3 and ev.4, new at 3 tasks
    assert (await ended_exactly(client, app, output)).restarts == 0  # a rescale is not a failure


async def test_a_stream_that_does_not_exist_is_refused_at_submit_naming_it(shared_cluster, shared_client, tmp_path):
    """`gearbus submit` (and the cluster runners) open the JetStream sources from the
    client first: a missing stream is an error before an app exists."""
    before = await shared_client.list()
    code, _, err = await gearbus("submit", "--nats", shared_cluster.url, APP, "--stream", "NOPE", "--until", "10",
                                 "--output", str(tmp_path / "x.jsonl"))
    assert code == 2
    assert "step 'events'" in err and "'NOPE' does not exist" in err
    assert await shared_client.list() == before
