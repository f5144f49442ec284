"""Waiting on a running cluster without polling: each wait is woken by the event that may
have changed what it waits for (a heartbeat, a state event, an election, a process exit)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Awaitable, Callable

from gearbus.client import Client
from shared import subjects
from shared.messages import AppState, CheckpointComplete, ClusterInfo, MasterElected, decode


async def wait_until(client: Client, subject: str, probe: Callable[[], Awaitable], timeout: float = 30.0,
                     watcher: Client | None = None):
    """Return the first truthy ``await probe()``, asking again each time a message
    arrives on ``subject`` (a heartbeat or state event says something may have changed).
    ``watcher``: the connection that may subscribe to ``subject`` (on a secure cluster a
    client may not), else ``client``'s."""
    woken = asyncio.Event()

    async def wake(msg):
        woken.set()

    sub = await (watcher or client).bus.nc.subscribe(subject, cb=wake)
    try:
        async with asyncio.timeout(timeout):
            while True:
                woken.clear()
                result = await probe()
                if result:
                    return result
                await woken.wait()
    finally:
        await sub.unsubscribe()


async def wait_for_cluster(client: Client, ready: Callable[[ClusterInfo], bool], timeout: float = 30.0,
                           watcher: Client | None = None) -> None:
    """Return once ``ready(info)`` holds for the master's ClusterInfo (asked again on
    each worker heartbeat, which a worker sends only once registered)."""

    async def probe():
        return ready(await client.info())

    await wait_until(client, subjects.WORKER_HEARTBEAT, probe, timeout, watcher)


async def wait_for_workers(client: Client, count: int, timeout: float = 30.0) -> None:
    """Return once the master lists ``count`` live workers."""
    await wait_for_cluster(client, lambda info: sum(w.alive for w in info.workers) >= count, timeout)


async def wait_state(client: Client, app_id: int, state: str, timeout: float = 30.0) -> None:
    """Wait for an app to reach ``state`` (a non-terminal one), woken by state events."""

    async def reached():
        return (await client.status(app_id)).state == state

    await wait_until(client, subjects.app_state_events(app_id), reached, timeout)


async def kill_an_executor_after_a_checkpoint(cluster, client: Client, app_id: int, timeout: float = 60.0,
                                             checkpoints: int = 1) -> None:
    """SIGKILL an executor once ``checkpoints`` checkpoints of the app completed while it
    still runs (woken by the checkpoints' completions)."""

    async def checkpointed():
        status = await client.status(app_id)
        assert status.state == AppState.ACTIVE, f"the app ended before the kill: {status.state} {status.error}"
        return status.checkpoints is not None and status.checkpoints.completed >= checkpoints

    await wait_until(client, subjects.checkpoint_complete(app_id), checkpointed, timeout)
    victim = next(pid for pid, _, kind in cluster.processes() if kind == "executor")
    os.kill(victim, signal.SIGKILL)


async def a_compaction_starts(client: Client, app_id: int, timeout: float = 60.0) -> int:
    """Return as the app's first compaction starts: the completion the AppMaster publishes
    right before it says so (``CheckpointComplete.compacting``). Its id."""
    found = asyncio.get_running_loop().create_future()

    async def on_complete(msg):
        complete = decode(msg.data)
        if isinstance(complete, CheckpointComplete) and complete.compacting and not found.done():
            found.set_result(complete.compacting)

    sub = await client.bus.nc.subscribe(subjects.checkpoint_complete(app_id), cb=on_complete)
    try:
        return await asyncio.wait_for(found, timeout)
    finally:
        await sub.unsubscribe()


async def wait_exited(pid: int, timeout: float) -> None:
    """Wait for any process (not only a child) to exit, via a pidfd: no polling."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    loop = asyncio.get_running_loop()
    exited = asyncio.Event()
    loop.add_reader(fd, exited.set)
    try:
        await asyncio.wait_for(exited.wait(), timeout)
    finally:
        loop.remove_reader(fd)
        os.close(fd)


async def next_election(client: Client, exclude: str) -> asyncio.Future:
    """A future resolved with the first MasterElected from a master other than ``exclude``."""
    elected = asyncio.get_running_loop().create_future()

    async def on_elected(msg):
        event = decode(msg.data, (MasterElected,))
        if event.master_id != exclude and not elected.done():
            elected.set_result(event)

    sub = await client.bus.nc.subscribe(subjects.MASTER_ELECTED, cb=on_elected)
    elected.add_done_callback(lambda _: asyncio.ensure_future(sub.unsubscribe()))
    return elected
