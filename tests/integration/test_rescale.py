"""Rescaling a running app on a real cluster (`gearbus rescale`): a keyed count reading
JetStream goes from 2 counting tasks to 4 and then to 1 while events flow, its state
divided by key group each time, and its final counts are exact; requests that cannot be
carried out are refused with the reason, the app untouched."""

from __future__ import annotations

import collections
import json

import pytest

from gearbus.artifact import pack
from gearbus.connectors.jetstream import ensure_stream_async
from shared import subjects
from shared.bus import RequestError
from shared.messages import AppState
from tests.support.cli import gearbus
from tests.support.cluster import wait_until
from tests.support.logs import logged
from tests.support import keyed_counts
from tests.support.user_counts import APP, EVENTS, args, counts, expected_counts, publish, read_at_least, start_counting

pytestmark = pytest.mark.timeout(150)


def counting(status) -> list[int]:
    """The indexes of the live tasks of the counting processor (id 1, count+format)."""
    return sorted(t.task.index for t in status.tasks if t.task.processor == 1)


async def test_a_keyed_count_rescaled_2_to_4_to_1_while_it_reads_is_exact(cluster, client, tmp_path):
    url, output = cluster.url, tmp_path / "counts.jsonl"
    app = await start_counting(client, url, output, EVENTS // 3)
    first = await read_at_least(client, app, EVENTS // 6)
    others = sum(1 for t in (await client.status(app)).tasks if t.task.processor != 1)

    code, out, err = await gearbus("rescale", "--nats", url, "--json", str(app), "count=4")
    assert code == 0, err
    done = json.loads(out)
    assert [n for name, n in done["processors"].items() if "count" in name] == [4] and done["epoch"] == 1

    async def four_counting():
        status = await client.status(app)
        return status if counting(status) == [0, 1, 2, 3] else None

    await wait_until(client, subjects.appmaster_heartbeat("*"), four_counting)
    await publish(url, EVENTS // 3, 2 * EVENTS // 3)
    await read_at_least(client, app, EVENTS // 6, after_checkpoint=first + 1)  # reading at 4
    done = await client.rescale(app, {"count": 1})
    assert done.epoch == 2
    await publish(url, 2 * EVENTS // 3, EVENTS)
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert final.restarts == 0  # a rescale is not a failure
    assert counts(output) == expected_counts()
    # the other processors' tasks went on in place: only the counting step's new tasks restored
    restored = [fields["task_id"] for fields in logged(cluster.log_dir, "task_restored")]
    assert len(restored) == 4 + 1 and all("count" in task for task in restored), restored
    kept = collections.Counter()
    for fields in logged(cluster.log_dir, "tasks_kept_running"):
        kept[fields["epoch"]] += fields["tasks"]
    assert kept == {1: others, 2: others}, (kept, others)


async def test_a_rescale_that_cannot_be_done_is_refused_with_the_reason_and_the_app_goes_on(cluster, client,
                                                                                            tmp_path):
    url, output = cluster.url, tmp_path / "counts.jsonl"
    app = await start_counting(client, url, output, EVENTS // 2)
    await read_at_least(client, app, 10)
    for asked, reason in (({"nope": 2}, "no step named 'nope'"),
                          ({"count": 0}, "parallelism 0 is not between 1 and 128"),
                          ({"count": 2}, "nothing to change"),
                          ({"write": 3}, "cannot be divided over another number of tasks")):
        with pytest.raises(RequestError, match=reason):
            await client.rescale(app, asked)
    code, _, err = await gearbus("rescale", "--nats", url, str(app), "count=x")
    assert code == 2 and "write STEP=N" in err
    await publish(url, EVENTS // 2, EVENTS)
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED and final.restarts == 0
    assert counts(output) == expected_counts()
    with pytest.raises(RequestError, match="only a running app can be rescaled"):
        await client.rescale(app, {"count": 3})


async def test_the_source_rescaled_spreads_its_subjects_anew_and_reads_each_on_exactly(cluster, client, tmp_path):
    """Events on five subjects: the reading step goes from 2 tasks to 3 and then to 1, each
    subject read on from where its old task was."""
    url, output = cluster.url, tmp_path / "counts.jsonl"
    await ensure_stream_async(client.bus.nc, "EV", ["ev.*"], 120, "file")
    await publish(url, 0, EVENTS // 3, subjects=5)
    app = await client.submit(pack(APP), args(output, 1))
    first = await read_at_least(client, app, EVENTS // 6)
    assert (await client.rescale(app, {"events": 3})).epoch == 1
    await publish(url, EVENTS // 3, 2 * EVENTS // 3, subjects=5)
    await read_at_least(client, app, EVENTS // 6, after_checkpoint=first + 1)  # reading in 3 tasks
    assert (await client.rescale(app, {"events": 1})).epoch == 2
    await publish(url, 2 * EVENTS // 3, EVENTS, subjects=5)
    final = await client.wait(app, timeout=90)
    assert final.state == AppState.SUCCEEDED, final.error
    assert counts(output) == expected_counts()


async def test_on_disk_a_rescale_takes_the_key_groups_from_local_copies_and_every_count_goes_on_exactly(
        cluster, client, tmp_path):
    """A running count per key in the rocksdb backend, rescaled 2 -> 3 -> 1 while numbers
    flow: the new tasks take their key groups from the old tasks' local copies of the
    rescale's checkpoint (their executors log it), and, stopped with a savepoint, every
    number committed was counted once."""
    output = tmp_path / "counts.jsonl"
    app = await client.submit(pack(keyed_counts.APP), ["40", str(output), "2", "rocksdb"])
    first = await read_at_least(client, app, 300)
    assert (await client.rescale(app, {"count": 3})).epoch == 1
    await read_at_least(client, app, 300, after_checkpoint=first + 1)
    assert (await client.rescale(app, {"count": 1})).epoch == 2
    await read_at_least(client, app, 300, after_checkpoint=first + 2)
    await client.savepoint(app, stop=True)
    assert keyed_counts.assert_counted_once(output, 40) > 900
    adopted = keyed_counts.groups_from_local_copies(cluster.log_dir)
    assert sum(groups["count"] for groups in adopted) >= 2 * 128, adopted  # both rescales, every group
