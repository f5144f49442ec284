"""The master's resource Scheduler: slots per worker, placement and priority.

Pure bookkeeping with no I/O, so it is tested without a network. The master turns
its decisions into messages.
"""

from __future__ import annotations

import collections
import itertools
from dataclasses import dataclass, field

from shared.messages import Allocation, Placement


class SchedulingError(ValueError):
    """A request can never be satisfied by this cluster as it is (not merely 'not now')."""


class InvalidResourceRequest(SchedulingError):
    """A request that is wrong in itself: no slots, an unknown placement or worker."""


@dataclass
class _Worker:
    slots: int
    used: int = 0

    @property
    def free(self) -> int:
        return self.slots - self.used


@dataclass(order=True)
class ResourceRequest:
    sort_key: tuple = field(init=False, repr=False)
    app_id: int = field(compare=False)
    slots: int = field(compare=False)
    min_slots: int = field(compare=False)
    placement: str = field(compare=False)
    worker_id: str = field(compare=False, default="")
    priority: int = field(compare=False, default=0)
    arrival: int = field(compare=False, default=0)
    exclude: frozenset[str] = field(compare=False, default=frozenset())  # workers not to use (blacklisted)

    def __post_init__(self):
        self.sort_key = (-self.priority, self.arrival)


class Scheduler:
    """Tracks free slots and decides where each request's slots go."""

    def __init__(self):
        self._workers: dict[str, _Worker] = {}
        self._held: dict[int, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self._waiting: list[ResourceRequest] = []
        self._arrivals = itertools.count()

    # --- workers -----------------------------------------------------------------

    def add_worker(self, worker_id: str, slots: int) -> None:
        worker = self._workers.get(worker_id)
        if worker is None:
            self._workers[worker_id] = _Worker(slots)
        else:
            worker.slots = slots

    def remove_worker(self, worker_id: str) -> list[int]:
        """Forget a worker and its slots; return the apps that held slots there."""
        self._workers.pop(worker_id, None)
        affected = []
        for app_id, held in self._held.items():
            if held.pop(worker_id, 0):
                affected.append(app_id)
        return affected

    def usage(self, worker_id: str) -> tuple[int, int]:
        worker = self._workers[worker_id]
        return worker.slots, worker.used

    @property
    def total_slots(self) -> int:
        return sum(w.slots for w in self._workers.values())

    @property
    def free_slots(self) -> int:
        return sum(max(w.free, 0) for w in self._workers.values())

    def workers_of(self, app_id: int) -> list[str]:
        return [w for w, n in self._held.get(app_id, {}).items() if n > 0]

    # --- requests ---------------------------------------------------------------

    def request(self, app_id: int, slots: int, placement: str = Placement.ANY, worker_id: str = "",
                priority: int = 0, min_slots: int = 0, exclude: frozenset[str] = frozenset()) -> ResourceRequest:
        """Validate a request and queue it; :meth:`schedule` serves the queue."""
        if slots < 1:
            raise InvalidResourceRequest(f"a resource request needs at least 1 slot, got {slots}")
        if placement not in Placement.ALL:
            raise InvalidResourceRequest(f"unknown placement {placement!r}; expected one of {sorted(Placement.ALL)}")
        if placement == Placement.WORKER and worker_id not in self._workers:
            raise InvalidResourceRequest(f"unknown worker {worker_id!r}")
        min_slots = min(max(min_slots, 1), slots) if min_slots else slots
        if placement == Placement.WORKER and worker_id in exclude:
            raise InvalidResourceRequest(f"worker {worker_id!r} is both asked for and excluded")
        capacity = self._capacity(placement, worker_id, exclude)
        if self._workers and min_slots > capacity:  # with no workers yet, wait for them
            raise SchedulingError(
                f"app {app_id} asks for {min_slots} slot(s) with placement {placement}, "
                f"but the cluster has only {capacity} there in all"
                + (f" outside the excluded workers {sorted(exclude)}" if exclude else "")
            )
        request = ResourceRequest(app_id, slots, min_slots, placement, worker_id, priority, next(self._arrivals),
                                  frozenset(exclude))
        self._waiting.append(request)
        self._waiting.sort()
        return request

    def cancel(self, request: ResourceRequest) -> None:
        if request in self._waiting:
            self._waiting.remove(request)

    def schedule(self) -> list[tuple[ResourceRequest, list[Allocation]]]:
        """Serve waiting requests in priority order; a request that cannot be served
        yet blocks the lower-priority ones behind it (no starvation of big requests)."""
        served = []
        while self._waiting:
            request = self._waiting[0]
            allocations = self._place(request)
            if allocations is None:
                break
            self._waiting.pop(0)
            for a in allocations:
                self._workers[a.worker_id].used += a.slots
                self._held[request.app_id][a.worker_id] += a.slots
            served.append((request, allocations))
        return served

    def hold(self, app_id: int, worker_id: str, slots: int = 1) -> None:
        """Record slots already in use (a worker re-registering with what it runs)."""
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.used += slots
            self._held[app_id][worker_id] += slots

    def release(self, app_id: int, worker_id: str, slots: int = 1) -> None:
        held = self._held.get(app_id)
        if not held or held[worker_id] <= 0:
            return
        n = min(slots, held[worker_id])
        held[worker_id] -= n
        worker = self._workers.get(worker_id)
        if worker is not None:
            worker.used = max(worker.used - n, 0)

    def release_app(self, app_id: int) -> None:
        for worker_id, n in self._held.pop(app_id, {}).items():
            worker = self._workers.get(worker_id)
            if worker is not None:
                worker.used = max(worker.used - n, 0)

    # --- placement --------------------------------------------------------------

    def _candidates(self, exclude: frozenset[str]) -> dict[str, _Worker]:
        return {w: s for w, s in self._workers.items() if w not in exclude}

    def _capacity(self, placement: str, worker_id: str, exclude: frozenset[str]) -> int:
        if placement == Placement.WORKER:
            return self._workers[worker_id].slots
        candidates = self._candidates(exclude).values()
        if placement == Placement.ONE_WORKER:
            return max((w.slots for w in candidates), default=0)
        return sum(w.slots for w in candidates)

    def _place(self, request: ResourceRequest) -> list[Allocation] | None:
        if request.placement == Placement.WORKER:
            worker = self._workers.get(request.worker_id)
            if worker is None or worker.free < request.min_slots:
                return None
            return [Allocation(request.worker_id, min(worker.free, request.slots))]
        candidates = self._candidates(request.exclude)
        if request.placement == Placement.ONE_WORKER:
            best = max(candidates.items(), key=lambda kv: kv[1].free, default=None)
            if best is None or best[1].free < request.min_slots:
                return None
            return [Allocation(best[0], min(best[1].free, request.slots))]
        # ANY: one slot at a time to the worker with the most free slots, to spread load.
        free = {w: max(s.free, 0) for w, s in candidates.items()}
        if sum(free.values()) < request.min_slots:
            return None
        taken: collections.Counter[str] = collections.Counter()
        for _ in range(min(request.slots, sum(free.values()))):
            worker_id = max(free, key=lambda w: (free[w], -taken[w]))
            free[worker_id] -= 1
            taken[worker_id] += 1
        return [Allocation(w, n) for w, n in sorted(taken.items())]
