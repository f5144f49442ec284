"""What every AppMaster program shares, whatever its application type
(docs/application-types.md): registering with the master, carrying out what its state
machine decides, and its stimulus log as `gearbus status --debug` shows it."""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable

import structlog

from shared import subjects
from shared.messages import AppMasterRegistered, AppStimuli, LaunchExecutor, MasterElected, RegisterAppMaster, \
    ReRegister, Stimulus
from shared.security import Security
from shared.service import Service

log = structlog.get_logger()

MASTER_RETRY_S = 30.0  # how long requests to the master are retried while it fails over


async def register(bus, launch: LaunchExecutor, worker_id: str) -> float:
    """Register this AppMaster (attempt ``launch.attempt``) with the leader; its heartbeat interval."""
    registered = await bus.request(
        subjects.appmaster_register(launch.app_id),
        RegisterAppMaster(launch.app_id, worker_id, os.getpid(), attempt=launch.attempt),
        expect=AppMasterRegistered,
        retry_s=MASTER_RETRY_S,
    )
    return registered.heartbeat_interval_s


class AppMasterProcess(Service):
    """The process of one app's AppMaster, whatever its type: who it is, and its registration
    with the leader (again when a new one takes office, or the leader does not know it)."""

    role = "appmaster"

    def __init__(self, servers, launch: LaunchExecutor, worker_id: str, security: Security = Security()):
        super().__init__(servers, node_id=f"app{launch.app_id}-appmaster", security=security)
        self.launch = launch
        self.app_id = launch.app_id
        self.worker_id = worker_id
        self.heartbeat_interval = 1.0

    async def register(self) -> None:
        self.heartbeat_interval = await register(self.bus, self.launch, self.worker_id)

    async def on_master_changed(self, msg: MasterElected | ReRegister) -> None:
        """A new leader (or one that does not know this app): register again."""
        log.info("reregistering", reason=type(msg).__name__)
        self.spawn(self.register(), "reregister")


async def dispatch(table: dict[type, Callable[[object], Awaitable[None]]], instructions: list, who: str) -> None:
    """Carry out instructions in order through ``table``; one it has no handler for is a bug,
    and fails loudly."""
    for instruction in instructions:
        handler = table.get(type(instruction))
        if handler is None:
            raise RuntimeError(f"{who} cannot carry out {instruction!r}")
        await handler(instruction)


def spawning(service: Service, method, name: str):
    """A handler that runs ``method(instruction)`` in the background: it waits on other
    processes, and reports back to the state machine as an event."""
    async def start(instruction) -> None:
        service.spawn(method(instruction), name)
    return start


async def log_instruction(logged) -> None:
    """A machine's Logged instruction: ``event`` at ``level`` with ``data``."""
    getattr(log, logged.level)(logged.event, **dict(logged.data))


def stimuli(app_id: int, entries, phase: str, epoch: int) -> AppStimuli:
    """A machine's stimulus log (gearbus/runtime/stimuli.py) as the answer to QueryStimuli."""
    now = time.monotonic()
    return AppStimuli(app_id, phase, epoch, [Stimulus(s.stimulus_id, s.event, round(max(now - s.at, 0.0), 3),
                                                      s.detail, list(s.decided)) for s in entries])
