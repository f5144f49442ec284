"""The master's worker registry, without a network: liveness on the time passed in."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.master.worker_registry import (
    DeclareWorkerLost,
    HeartbeatMissed,
    HeartbeatResumed,
    WorkerConflict,
    WorkerRegistry,
)


def registry() -> WorkerRegistry:
    return WorkerRegistry(heartbeat_interval_s=1.0, timeout_s=10.0)


def test_a_silent_worker_is_logged_once_after_three_intervals_then_lost_past_the_timeout():
    r = registry()
    r.registered("w1", "host", 11, 4, now=100.0, now_ms=5)
    assert r.tick(103.0) == []
    assert r.tick(103.1) == [HeartbeatMissed("w1", pytest.approx(3.1))]
    assert r.tick(105.0) == []  # once per silence
    assert r.heartbeat("w1", 106.0, 7) == [HeartbeatResumed("w1")]
    assert r.workers["w1"].heard_ms == 7
    assert r.tick(116.0) == [HeartbeatMissed("w1", pytest.approx(10.0))]
    assert r.tick(116.5) == [DeclareWorkerLost("w1", pytest.approx(10.5))]
    assert not r.workers["w1"].alive and r.alive() == []
    assert r.tick(200.0) == []  # lost once
    assert r.heartbeat("w1", 201.0, 9) is None  # it must register again
    r.validate()


def test_liveness_follows_the_time_passed_in_not_a_wall_clock():
    """The heard_ms shown may jump (a wall clock set back); the monotonic ``now`` decides."""
    r = registry()
    r.registered("w1", "host", 11, 4, now=50.0, now_ms=10**12)
    assert r.heartbeat("w1", 59.0, 0) == []
    assert r.tick(68.9) == [HeartbeatMissed("w1", pytest.approx(9.9))]
    assert r.workers["w1"].alive


def test_a_second_process_under_a_live_workers_id_is_refused_and_a_lost_one_may_come_back():
    r = registry()
    r.registered("w1", "host", 11, 4, now=0.0, now_ms=0)
    r.registered("w1", "host", 11, 4, now=1.0, now_ms=0)  # the same process again: a re-registration
    with pytest.raises(WorkerConflict, match="worker id w1 is already registered by pid 11 on host"):
        r.registered("w1", "host", 12, 4, now=2.0, now_ms=0)
    r.tick(20.0)
    r.registered("w1", "host", 12, 2, now=21.0, now_ms=0)  # lost: another process may take the id
    assert r.workers["w1"].pid == 12 and r.workers["w1"].alive
    r.validate()


def test_workers_recorded_before_this_master_took_office_are_known_but_not_alive():
    r = registry()
    r.took_office([("w1", "h", 1, 4), ("w2", "h", 2, 4)], now=0.0, now_ms=0)
    assert sorted(r.workers) == ["w1", "w2"] and r.alive() == []
    assert r.heartbeat("w1", 1.0, 0) is None  # told to register with this master
    assert r.tick(100.0) == []


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["register", "heartbeat", "tick"]), st.sampled_from(["w1", "w2"]),
                          st.floats(0, 5)), max_size=40))
def test_any_ordering_keeps_the_invariants_and_loses_a_worker_at_most_once_per_registration(events):
    r, now, lost = registry(), 0.0, []
    registrations = {"w1": 0, "w2": 0}
    for kind, worker_id, step in events:
        now += step
        if kind == "register":
            r.registered(worker_id, "h", 1, 4, now, 0)
            registrations[worker_id] += 1
        elif kind == "heartbeat":
            r.heartbeat(worker_id, now, 0)
        else:
            lost += [i.worker_id for i in r.tick(now) if isinstance(i, DeclareWorkerLost)]
        r.validate()
    for worker_id, count in registrations.items():
        assert lost.count(worker_id) <= count
