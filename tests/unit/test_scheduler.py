"""The Scheduler's placement, priority and accounting, without a network."""

import pytest

from services.master.scheduler import Scheduler, SchedulingError
from shared.messages import Allocation, Placement


def make(**workers) -> Scheduler:
    scheduler = Scheduler()
    for name, slots in workers.items():
        scheduler.add_worker(name, slots)
    return scheduler


def serve(scheduler, *args, **kwargs):
    scheduler.request(*args, **kwargs)
    return scheduler.schedule()


def test_any_placement_spreads_over_the_freest_workers():
    scheduler = make(a=4, b=4)
    [(_, allocations)] = serve(scheduler, 1, 4, Placement.ANY)
    assert allocations == [Allocation("a", 2), Allocation("b", 2)]
    assert scheduler.free_slots == 4


def test_one_worker_placement_keeps_slots_together():
    scheduler = make(a=2, b=3)
    [(_, allocations)] = serve(scheduler, 1, 3, Placement.ONE_WORKER)
    assert allocations == [Allocation("b", 3)]


def test_specific_worker_placement():
    scheduler = make(a=2, b=3)
    [(_, allocations)] = serve(scheduler, 1, 2, Placement.WORKER, worker_id="a")
    assert allocations == [Allocation("a", 2)]
    with pytest.raises(SchedulingError, match="unknown worker 'zz'"):
        scheduler.request(1, 1, Placement.WORKER, worker_id="zz")


def test_requests_wait_for_slots_and_are_served_by_priority():
    scheduler = make(a=2)
    serve(scheduler, 1, 2)
    low = scheduler.request(2, 1, priority=0)
    high = scheduler.request(3, 1, priority=5)
    assert scheduler.schedule() == []
    scheduler.release(1, "a", 1)
    [(served, _)] = scheduler.schedule()
    assert served is high
    scheduler.release_app(1)
    [(served, _)] = scheduler.schedule()
    assert served is low


def test_min_slots_allows_a_partial_grant():
    scheduler = make(a=3)
    serve(scheduler, 1, 2)
    [(_, allocations)] = serve(scheduler, 2, 4, min_slots=1)
    assert allocations == [Allocation("a", 1)]


def test_impossible_requests_fail_at_once():
    scheduler = make(a=2, b=2)
    with pytest.raises(SchedulingError, match="only 4 there in all"):
        scheduler.request(1, 5)
    with pytest.raises(SchedulingError, match="only 2 there in all"):
        scheduler.request(1, 3, Placement.ONE_WORKER)
    with pytest.raises(SchedulingError, match="unknown placement"):
        scheduler.request(1, 1, "somewhere")


def test_removing_a_worker_reports_the_apps_that_held_slots_there():
    scheduler = make(a=2, b=2)
    serve(scheduler, 7, 2)
    assert scheduler.remove_worker("a") == [7]
    assert scheduler.total_slots == 2


def test_a_cluster_without_workers_yet_queues_requests_until_one_registers():
    scheduler = Scheduler()
    scheduler.request(1, 1)
    assert scheduler.schedule() == []
    scheduler.add_worker("late", 2)
    [(_, allocations)] = scheduler.schedule()
    assert allocations == [Allocation("late", 1)]


def test_excluded_workers_get_no_slots():
    scheduler = make(a=4, b=4)
    [(_, allocations)] = serve(scheduler, 1, 3, exclude=frozenset({"a"}))
    assert allocations == [Allocation("b", 3)]
    with pytest.raises(SchedulingError, match="outside the excluded workers"):
        scheduler.request(2, 5, exclude=frozenset({"b"}))  # a alone has only 4
