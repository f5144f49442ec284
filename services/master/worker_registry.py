"""The master's registry of workers and their liveness: a state machine without I/O.

The master's shell feeds it events (a worker registers, heartbeats, this master takes office
with the workers recorded in KV, a tick with the time) and carries out what it returns
(log a silence, declare a worker lost). Time comes in as ``now`` from the monotonic clock,
so a wall clock set back or forward never loses a worker; the wall-clock time of a
worker's last heartbeat is kept only to show it.

    worker state   event                                -> state   instructions
    (new)          registered                           ALIVE
    (recorded)     took office                          GONE     (until it registers with this master)
    ALIVE          heartbeat                            ALIVE    [HeartbeatResumed after a logged silence]
    ALIVE          tick: silent past 3 intervals        ALIVE    HeartbeatMissed (once per silence)
    ALIVE          tick: silent past the timeout        GONE     DeclareWorkerLost
    GONE           registered                           ALIVE
"""

from __future__ import annotations

from dataclasses import dataclass

MISSED_HEARTBEATS_LOGGED = 3  # after this many intervals of silence a worker's silence is logged


@dataclass
class Worker:
    """What the master knows of one worker."""
    worker_id: str
    host: str
    pid: int
    slots: int
    alive: bool = True
    heard_at: float = 0.0  # monotonic: when it last registered or heartbeat
    heard_ms: int = 0  # wall clock, epoch ms: the same moment, to show
    missed_logged: bool = False


@dataclass(frozen=True)
class HeartbeatMissed:
    """Log that the worker has been silent ``silent_s`` (it is not lost yet)."""
    worker_id: str
    silent_s: float


@dataclass(frozen=True)
class HeartbeatResumed:
    worker_id: str


@dataclass(frozen=True)
class DeclareWorkerLost:
    """The worker is gone: forget its slots, tell the apps that ran there."""
    worker_id: str
    silent_s: float


Instruction = HeartbeatMissed | HeartbeatResumed | DeclareWorkerLost


class WorkerConflict(Exception):
    """A registration under the id of another live worker."""


class WorkerRegistry:
    def __init__(self, heartbeat_interval_s: float, timeout_s: float):
        self.heartbeat_interval_s = heartbeat_interval_s
        self.timeout_s = timeout_s
        self.workers: dict[str, Worker] = {}

    def alive(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.alive]

    def took_office(self, recorded: list[tuple[str, str, int, int]], now: float, now_ms: int) -> None:
        """The workers recorded in KV, (id, host, pid, slots): known, not alive until they
        register with this master."""
        self.workers = {worker_id: Worker(worker_id, host, pid, slots, False, now, now_ms)
                        for worker_id, host, pid, slots in recorded}

    def registered(self, worker_id: str, host: str, pid: int, slots: int, now: float, now_ms: int) -> None:
        """Raises WorkerConflict if a live worker of that id is another process."""
        known = self.workers.get(worker_id)
        if known is not None and known.alive and (known.host, known.pid) != (host, pid):
            raise WorkerConflict(f"worker id {worker_id} is already registered by pid {known.pid} on {known.host}")
        self.workers[worker_id] = Worker(worker_id, host, pid, slots, True, now, now_ms)

    def heartbeat(self, worker_id: str, now: float, now_ms: int) -> list[Instruction] | None:
        """None: the worker is unknown or lost here, and must register again."""
        worker = self.workers.get(worker_id)
        if worker is None or not worker.alive:
            return None
        worker.heard_at, worker.heard_ms = now, now_ms
        if worker.missed_logged:
            worker.missed_logged = False
            return [HeartbeatResumed(worker_id)]
        return []

    def tick(self, now: float) -> list[Instruction]:
        instructions: list[Instruction] = []
        for worker in self.alive():
            silent = now - worker.heard_at
            if silent > self.timeout_s:
                worker.alive, worker.missed_logged = False, False
                instructions.append(DeclareWorkerLost(worker.worker_id, silent))
            elif silent > MISSED_HEARTBEATS_LOGGED * self.heartbeat_interval_s and not worker.missed_logged:
                worker.missed_logged = True
                instructions.append(HeartbeatMissed(worker.worker_id, silent))
        return instructions

    def validate(self) -> None:
        """Raise AssertionError if the registry is inconsistent (run by tests)."""
        for worker_id, worker in self.workers.items():
            assert worker.worker_id == worker_id, (worker_id, worker)
            assert worker.slots >= 0, worker
            assert worker.alive or not worker.missed_logged, worker
