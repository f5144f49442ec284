"""The checkpoint coordinator's transitions, without a network: events in, actions out."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.runtime.checkpoints import (
    AbandonCheckpoint,
    CompactCheckpoint,
    CheckpointCoordinator,
    CheckpointMeta,
    HISTORY_KEPT,
    CheckpointRecord,
    FailApplication,
    NotifyComplete,
    Outcome,
    Phase,
    PruneCheckpoints,
    RetriggerCheckpoint,
    StoreCheckpoint,
    TriggerCheckpoint,
)

SRC, MAP0, MAP1 = (0, 0), (1, 0), (1, 1)
TASKS = [MAP1, SRC, MAP0]


def coordinator(interval_s: float = 10, timeout_s: float = 5, keep: int = 2,
                max_consecutive_failures: int = 2, **kw) -> CheckpointCoordinator:
    c = CheckpointCoordinator(TASKS, [SRC], interval_s=interval_s, timeout_s=timeout_s, keep=keep,
                              max_consecutive_failures=max_consecutive_failures, **kw)
    assert c.start(now=0) == []
    return c


def ack_all(c: CheckpointCoordinator, cid: int, now: float, ended: bool = False, epoch: int | None = None):
    epoch = c.epoch if epoch is None else epoch
    actions = []
    for i, task in enumerate(TASKS):
        actions = c.ack(cid, epoch, task, size_bytes=10 * (i + 1), ended=ended, now=now)
        if task is not TASKS[-1]:
            assert actions == []
    return actions


def complete(c: CheckpointCoordinator, cid: int, now: float, ended: bool = False):
    [store] = ack_all(c, cid, now, ended)
    assert isinstance(store, StoreCheckpoint) and store.meta.checkpoint_id == cid
    return c.stored(cid, now)


# -- triggering ------------------------------------------------------------------------------

def test_no_trigger_before_the_interval_then_one_at_the_interval():
    c = coordinator(interval_s=10)
    assert c.tick(now=9.9) == []
    assert c.tick(now=10) == [TriggerCheckpoint(1, 0, (SRC,))]
    assert c.phase is Phase.IN_FLIGHT and c.in_flight == 1


def test_the_first_tick_starts_the_timer_when_start_was_not_called():
    c = CheckpointCoordinator(TASKS, [SRC], interval_s=10, timeout_s=5, keep=1, max_consecutive_failures=0)
    assert c.tick(now=100) == []
    assert c.tick(now=109) == []
    assert c.tick(now=110) == [TriggerCheckpoint(1, 0, (SRC,))]


def test_periodic_checkpoints_off_never_trigger():
    c = coordinator(interval_s=0)
    assert all(c.tick(now=t) == [] for t in range(0, 1000, 50))


def test_only_one_checkpoint_in_flight_and_the_interval_counts_from_the_last_trigger():
    c = coordinator(interval_s=10, timeout_s=100)
    assert c.tick(now=10) == [TriggerCheckpoint(1, 0, (SRC,))]
    assert c.tick(now=50) == [RetriggerCheckpoint(1, 0)]  # long past the interval, but one is in flight
    assert complete(c, 1, now=60) == [NotifyComplete(1, 0, False)]
    assert c.tick(now=60) == [TriggerCheckpoint(2, 0, (SRC,))]  # 50s since the last trigger
    complete(c, 2, now=61)
    assert c.tick(now=69.9) == []
    assert c.tick(now=70) == [TriggerCheckpoint(3, 0, (SRC,))]


def test_a_checkpoint_in_flight_is_triggered_again_every_repeat_interval_until_acked():
    """Triggers and acks are core NATS: a server restart can lose them."""
    c = coordinator(interval_s=10, timeout_s=100)
    assert c.tick(now=10) == [TriggerCheckpoint(1, 0, (SRC,))]
    assert c.tick(now=10.9) == []
    assert c.tick(now=11) == [RetriggerCheckpoint(1, 0)]
    assert c.tick(now=11.5) == []
    assert c.tick(now=12.1) == [RetriggerCheckpoint(1, 0)]
    ack_all(c, 1, now=12.5)
    assert c.phase is Phase.STORING and c.tick(now=20) == []  # every ack came: nothing to repeat
    c.check_invariants()


# -- acks and completion ---------------------------------------------------------------------

def test_completion_only_when_every_task_acked_then_stored_notifies():
    c = coordinator()
    c.tick(now=10)
    assert c.ack(1, 0, SRC, 10, False, now=11) == []
    assert c.ack(1, 0, MAP0, 20, False, now=12) == []
    assert c.phase is Phase.IN_FLIGHT
    [store] = c.ack(1, 0, MAP1, 30, False, now=13)
    assert store == StoreCheckpoint(CheckpointMeta(
        checkpoint_id=1, epoch=0, started_at=10, duration_s=3, size_bytes=60,
        tasks=(SRC, MAP0, MAP1), final=False))
    assert c.phase is Phase.STORING and c.latest() is None
    assert c.tick(now=100) == []  # storing is not timed out: the shell reports stored/store_failed
    assert c.stored(1, now=14) == [NotifyComplete(1, 0, False)]
    assert c.phase is Phase.IDLE and c.latest() == store.meta
    stats = c.stats()
    assert (stats.latest, stats.latest_completed_at, stats.completed, stats.failed, stats.in_flight) == (
        store.meta, 14, 1, 0, None)


def test_acks_that_do_not_belong_to_the_checkpoint_in_flight_are_ignored_and_counted():
    c = coordinator(interval_s=1, timeout_s=100)
    c.tick(now=1)
    complete(c, 1, now=2)
    c.tick(now=3)  # checkpoint 2 in flight
    assert c.ack(2, 1, SRC, 1, False, now=4) == []        # another epoch
    assert c.ack(1, 0, SRC, 1, False, now=4) == []        # the completed one: stale
    assert c.ack(7, 0, SRC, 1, False, now=4) == []        # never triggered
    assert c.ack(2, 0, (9, 9), 1, False, now=4) == []     # unknown task
    assert c.ack(2, 0, SRC, 1, False, now=4) == []
    assert c.ack(2, 0, SRC, 1, False, now=4) == []        # duplicate
    assert c.ack(2, 0, MAP0, 1, False, now=4) == []
    assert c.ack(2, 0, MAP1, 1, False, now=4) != []       # completes with one ack per task
    assert c.ack(2, 0, MAP1, 1, False, now=4) == []       # duplicate while storing
    assert c.stored(1, now=5) == []                       # not the one being stored
    assert c.ignored == {"ack_wrong_epoch": 1, "ack_stale": 1, "ack_unknown_id": 1,
                         "ack_unknown_task": 1, "ack_duplicate": 2, "stored_stale": 1}
    assert c.stored(2, now=5) == [NotifyComplete(2, 0, False)]


# -- failures ---------------------------------------------------------------------------------

def test_a_timed_out_checkpoint_is_abandoned_and_the_next_goes_on_at_the_next_tick():
    c = coordinator(interval_s=2, timeout_s=5)
    assert c.tick(now=2) == [TriggerCheckpoint(1, 0, (SRC,))]
    assert c.tick(now=7) == [RetriggerCheckpoint(1, 0)]  # exactly the timeout: not yet
    assert c.tick(now=7.5) == [AbandonCheckpoint(1, "timeout after 5s")]
    assert c.stats().failed == 1 and c.in_flight is None
    assert c.ack(1, 0, SRC, 1, False, now=7.6) == []  # late ack of the abandoned one
    assert c.ignored["ack_stale"] == 1
    assert c.tick(now=7.7) == [TriggerCheckpoint(2, 0, (SRC,))]


def test_a_decline_abandons_the_checkpoint():
    c = coordinator()
    c.tick(now=10)
    assert c.decline(1, 0, MAP0, "disk full", now=11) == [AbandonCheckpoint(1, "declined by (1, 0): disk full")]
    assert c.phase is Phase.IDLE and c.stats().failed == 1
    assert c.decline(1, 0, MAP0, "again", now=11) == []
    assert c.ignored["decline_stale"] == 1


def test_a_failed_store_abandons_the_checkpoint():
    c = coordinator()
    c.tick(now=10)
    ack_all(c, 1, now=11)
    # the record may be written all the same (a timeout): its snapshots stay until pruned
    assert c.store_failed(1, "kv timeout", now=12) == [AbandonCheckpoint(1, "store failed: kv timeout", False)]
    assert c.stored(1, now=13) == [] and c.latest() is None
    assert c.stats().failed == 1


def test_more_than_the_allowed_consecutive_failures_fail_the_application_once():
    c = coordinator(interval_s=1, timeout_s=100, max_consecutive_failures=2)
    outcomes = []
    for cid in (1, 2, 3):
        assert c.tick(now=cid) == [TriggerCheckpoint(cid, 0, (SRC,))]
        outcomes.append(c.decline(cid, 0, SRC, "boom", now=cid))
    assert outcomes[:2] == [[AbandonCheckpoint(1, "declined by (0, 0): boom")],
                            [AbandonCheckpoint(2, "declined by (0, 0): boom")]]
    assert outcomes[2] == [AbandonCheckpoint(3, "declined by (0, 0): boom"),
                           FailApplication("3 consecutive checkpoint failures, last: declined by (0, 0): boom")]
    # failed is terminal: nothing more is triggered or accepted
    assert c.tick(now=1000) == []
    assert c.decline(3, 0, SRC, "boom", now=1000) == []
    assert c.stats().failed == 3


def test_a_success_resets_the_consecutive_failure_count():
    c = coordinator(interval_s=1, timeout_s=100, max_consecutive_failures=1)
    c.tick(now=1)
    assert c.decline(1, 0, SRC, "x", now=1) == [AbandonCheckpoint(1, "declined by (0, 0): x")]
    c.tick(now=2)
    assert complete(c, 2, now=2) == [NotifyComplete(2, 0, False)]
    assert c.stats().consecutive_failures == 0
    c.tick(now=3)
    assert c.decline(3, 0, SRC, "x", now=3) == [AbandonCheckpoint(3, "declined by (0, 0): x")]
    c.tick(now=4)
    assert FailApplication in {type(a) for a in c.decline(4, 0, SRC, "x", now=4)}
    assert c.stats().failed == 3


# -- the final checkpoint ---------------------------------------------------------------------

def test_the_final_checkpoint_is_triggered_when_every_task_ended_even_with_periodic_off():
    c = coordinator(interval_s=0)
    assert c.task_ended(SRC, now=1) == []
    assert c.task_ended(SRC, now=1) == []
    assert c.task_ended(MAP0, now=2) == []
    assert c.task_ended((5, 5), now=2) == []
    assert c.task_ended(MAP1, now=3) == [TriggerCheckpoint(1, 0, (SRC,))]
    [store] = ack_all(c, 1, now=4, ended=True)
    assert store.meta.final
    assert c.stored(1, now=5) == [NotifyComplete(1, 0, True)]
    assert c.tick(now=1000) == []  # nothing left to checkpoint


def test_the_final_checkpoint_waits_for_the_one_in_flight_to_complete():
    c = coordinator(interval_s=1, timeout_s=100)
    c.tick(now=1)  # checkpoint 1, taken before the tasks ended
    for task in TASKS:
        assert c.task_ended(task, now=2) == []
    ack_all(c, 1, now=3, ended=False)
    assert c.stored(1, now=4) == [NotifyComplete(1, 0, False), TriggerCheckpoint(2, 0, (SRC,))]
    assert complete(c, 2, now=5, ended=True) == [NotifyComplete(2, 0, True)]


def test_the_final_checkpoint_follows_an_abandoned_one_at_once():
    c = coordinator(interval_s=1, timeout_s=5)
    c.tick(now=1)
    for task in TASKS:
        c.task_ended(task, now=2)
    assert c.tick(now=7) == [AbandonCheckpoint(1, "timeout after 5s"), TriggerCheckpoint(2, 0, (SRC,))]


def test_a_periodic_checkpoint_whose_acks_all_say_ended_is_final():
    c = coordinator(interval_s=1)
    c.tick(now=1)
    assert complete(c, 1, now=2, ended=True) == [NotifyComplete(1, 0, True)]
    assert c.latest().final and c.tick(now=100) == []


# -- pruning, recovery, relaunch --------------------------------------------------------------

def test_pruning_keeps_the_last_n_completed_checkpoints():
    c = coordinator(interval_s=1, timeout_s=100, keep=2)
    results = []
    for cid in range(1, 5):
        c.tick(now=cid)
        results.append(complete(c, cid, now=cid))
    assert results == [[NotifyComplete(1, 0, False)], [NotifyComplete(2, 0, False)],
                       [NotifyComplete(3, 0, False), PruneCheckpoints((1,))],
                       [NotifyComplete(4, 0, False), PruneCheckpoints((2,))]]


def test_a_checkpoint_a_kept_one_builds_on_is_pruned_only_once_none_does():
    """Snapshots are incremental: checkpoint n's chain reads every checkpoint from its root
    on, so those stay while a kept checkpoint needs them (gearbus/runtime/snapshots.py)."""
    roots = {1: 1, 2: 1, 3: 3, 4: 3, 5: 5, 6: 5}  # whole snapshots at 1, 3 and 5

    def run(root_of) -> dict[int, list[int]]:
        c = coordinator(interval_s=1, timeout_s=100, keep=2)
        pruned = {}
        for cid in roots:
            c.tick(now=cid)
            for task in TASKS:
                actions = c.ack(cid, 0, task, size_bytes=1, ended=False, now=cid, root=root_of(cid, task))
            assert actions[0].meta.needs_from == min(root_of(cid, task) for task in TASKS)
            pruned[cid] = [i for a in c.stored(cid, now=cid) if isinstance(a, PruneCheckpoints)
                           for i in a.checkpoint_ids]
            c.check_invariants()
        return pruned

    # kept {3, 4} need 3 on: 1 and 2 go; kept {5, 6} need 5 on: 3 and 4 go
    assert run(lambda cid, task: roots[cid]) == {1: [], 2: [], 3: [], 4: [1, 2], 5: [], 6: [3, 4]}
    # one task's chain still starts at 1: nothing goes
    assert run(lambda cid, task: 1 if task == MAP0 else roots[cid]) == {cid: [] for cid in roots}


def test_one_compaction_at_a_time_of_deep_chains_moves_the_root_and_is_never_pruned_under_it():
    """Chains rooted at 1 grow a snapshot per checkpoint; the coordinator asks for the
    deep ones to be compacted, keeps what the compaction reads, then needs nothing older."""
    c = coordinator(interval_s=1, timeout_s=100, keep=1, compact_depth=2)

    def checkpoint(cid: int, root: int, depth_of) -> list:
        c.tick(now=cid)
        for task in TASKS:
            c.ack(cid, 0, task, size_bytes=1, ended=False, now=cid, root=root, depth=depth_of(task))
        actions = c.stored(cid, now=cid)
        c.check_invariants()
        return actions

    assert checkpoint(1, 0, lambda task: 0) == [NotifyComplete(1, 0, False)]
    assert checkpoint(2, 1, lambda task: 0 if task == SRC else 1) == [NotifyComplete(2, 0, False)]
    # MAP0's chain is deep enough: every task whose snapshot builds on another is compacted
    assert checkpoint(3, 1, lambda task: 0 if task == SRC else 2 if task == MAP0 else 1) == [
        NotifyComplete(3, 0, False, 0, compacting=3), CompactCheckpoint(3, 0, (MAP0, MAP1))]
    assert c.compacted(99, ok=True) == [] and c.ignored["compacted_unknown"] == 1
    assert c.compacted(3, ok=True) == []  # 3 stays kept, and with it what it read
    c.check_invariants()
    # 4 was taken before the tasks heard of it: its chains count from 1 (through 3, which
    # is not compacted again so soon); it reaches back to 1, so nothing goes
    assert checkpoint(4, 1, lambda task: 3) == [NotifyComplete(4, 0, False, 3)]
    # the tasks learn of it and their chains start at 3: 1 and 2 go (4 stays while 5 needs 3)
    assert checkpoint(5, 3, lambda task: 2) == [NotifyComplete(5, 0, False, 3, compacting=5),
                                                CompactCheckpoint(5, 0, tuple(sorted(TASKS))),
                                                PruneCheckpoints((1, 2))]
    assert c.compacted(5, ok=False) == []  # a failed compaction leaves the chains as they are
    assert checkpoint(6, 3, lambda task: 1) == [NotifyComplete(6, 0, False, 3)]  # 6 -> 5 -> 4 -> 3
    assert checkpoint(7, 0, lambda task: 0) == [NotifyComplete(7, 0, False, 3), PruneCheckpoints((3, 4, 5, 6))]
    c.check_invariants()


def test_chains_are_compacted_once_their_bytes_reach_the_whole_snapshots_they_start_from():
    """Tiered by size: with deep compaction far off, a checkpoint is compacted once the
    snapshots since the whole ones add up to half their bytes, then again once the changes
    since the compacted one do (its size as the compaction wrote it)."""
    c = coordinator(interval_s=1, timeout_s=100, keep=3, compact_depth=16)
    roots = {task: 0 for task in TASKS}

    def checkpoint(cid: int, size_of) -> list:
        c.tick(now=cid)
        for task in TASKS:
            depth = 0 if roots[task] == 0 else cid - roots[task]
            c.ack(cid, 0, task, size_bytes=size_of(task), ended=False, now=cid, root=roots[task] or cid, depth=depth)
        actions = c.stored(cid, now=cid)
        c.check_invariants()
        return [a for a in actions if isinstance(a, CompactCheckpoint)]

    assert checkpoint(1, lambda task: 100) == []  # whole: 300 bytes
    roots.update({task: 1 for task in TASKS})
    compacted_at = [cid for cid in range(2, 20) if checkpoint(cid, lambda task: 10)]
    assert compacted_at[0] == 6  # 5 checkpoints of 30 bytes: 150, half of 300
    c.compacted(6, ok=True, sizes={task: 300 for task in TASKS})  # the state grew: 900 bytes whole
    roots.update({task: 6 for task in TASKS})
    assert [cid for cid in range(20, 30) if checkpoint(cid, lambda task: 10)] == [21]  # 7..21: 450, half of 900
    c.check_invariants()


def test_a_depth_acked_before_the_tasks_heard_of_a_compaction_starts_no_other_and_a_newer_whole_one_stays_the_root():
    """The depths of checkpoints the tasks took before they heard of a compaction still
    count from the old root: they do not start another compaction of the whole state. A
    whole checkpoint that completes while a compaction runs is the root the bytes count
    from, whatever the compaction wrote."""
    c = coordinator(interval_s=1, timeout_s=100, keep=3, compact_depth=16)

    def checkpoint(cid: int, root: int, size: int = 10) -> list:
        c.tick(now=cid)
        for task in TASKS:
            c.ack(cid, 0, task, size_bytes=size, ended=False, now=cid, root=root if root else cid,
                  depth=cid - root if root else 0)
        actions = c.stored(cid, now=cid)
        c.check_invariants()
        return [a.checkpoint_id for a in actions if isinstance(a, CompactCheckpoint)]

    assert checkpoint(1, 0, size=100_000) == []
    assert [cid for cid in range(2, 18) if checkpoint(cid, 1)] == [17]  # 16 deep
    assert [cid for cid in range(18, 21) if checkpoint(cid, 1)] == []  # while it runs
    c.compacted(17, ok=True, sizes={task: 100_000 for task in TASKS})
    assert checkpoint(21, 1) == []  # 20 deep from the old root: 4 from the compacted one
    assert [cid for cid in range(22, 40) if checkpoint(cid, 17)] == [33]  # 16 from 17

    # a whole checkpoint completes while a compaction of a large state runs
    assert checkpoint(40, 0, size=100) == []  # 300 bytes whole: the root now
    c.compacted(33, ok=True, sizes={task: 100_000 for task in TASKS})
    assert [cid for cid in range(41, 50) if checkpoint(cid, 40, size=50)] == [42]  # 300 bytes of changes


def test_restart_abandons_the_checkpoint_in_flight_bumps_the_epoch_and_ids_go_on():
    c = coordinator(interval_s=1, timeout_s=100)
    c.tick(now=1)
    complete(c, 1, now=1)
    c.tick(now=2)
    c.ack(2, 0, SRC, 1, False, now=2)
    c.task_ended(MAP0, now=2)
    assert c.restart(epoch=1, now=3) == [AbandonCheckpoint(2, "recovery")]
    assert c.epoch == 1 and c.in_flight is None
    assert c.latest().checkpoint_id == 1  # what the shell restores
    assert c.stats().failed == 0  # a recovery is not a checkpoint failure
    assert c.tick(now=3.5) == []  # the interval restarted
    assert c.tick(now=4) == [TriggerCheckpoint(3, 1, (SRC,))]
    assert c.ack(3, 0, SRC, 1, False, now=4) == []  # the old epoch
    assert c.ignored["ack_wrong_epoch"] == 1
    assert complete(c, 3, now=5) == [NotifyComplete(3, 1, False)]
    c.task_ended(SRC, now=6)
    assert c.task_ended(MAP1, now=6) == []  # MAP0's end was before the recovery: forgotten
    assert c.restart(epoch=2, now=7) == []  # nothing in flight
    with pytest.raises(ValueError):
        c.restart(epoch=2, now=8)


def test_a_relaunched_appmaster_continues_after_the_restored_checkpoint():
    meta = CheckpointMeta(41, 3, 0.0, 1.0, 100, (SRC, MAP0, MAP1), False)
    assert CheckpointMeta.from_dict({**meta.to_dict(), "tasks": [list(t) for t in meta.tasks]}) == meta
    c = coordinator(interval_s=1, timeout_s=100, keep=1, epoch=4, restored_from=meta)
    assert c.latest() == meta
    assert c.tick(now=1) == [TriggerCheckpoint(42, 4, (SRC,))]
    assert complete(c, 42, now=2) == [NotifyComplete(42, 4, False), PruneCheckpoints((41,))]


def test_invalid_configuration_is_refused():
    with pytest.raises(ValueError):
        CheckpointCoordinator([], [], interval_s=1, timeout_s=1, keep=1, max_consecutive_failures=0)
    with pytest.raises(ValueError):
        CheckpointCoordinator([SRC], [MAP0], interval_s=1, timeout_s=1, keep=1, max_consecutive_failures=0)
    with pytest.raises(ValueError):
        CheckpointCoordinator([SRC], [SRC], interval_s=1, timeout_s=1, keep=0, max_consecutive_failures=0)


# -- properties over random event sequences ---------------------------------------------------

_id_sel = st.sampled_from(["current", "current", "current", "previous", "next"])
_epoch_sel = st.sampled_from(["current", "current", "current", "old"])
_task = st.sampled_from(TASKS + [(9, 9)])
# how often each event comes: weighted towards those that move a checkpoint along,
# so that many checkpoints complete; restarts and failures are rarer
_KINDS = ["tick"] * 6 + ["ack"] * 8 + ["ack_every_task"] * 2 + ["stored"] * 3 + [
    "decline", "store_failed", "task_ended", "task_ended", "restart", "compacted", "compacted"]


@st.composite
def _event(draw):
    kind = draw(st.sampled_from(_KINDS))
    if kind == "tick":
        return kind, draw(st.floats(0, 4))
    if kind == "ack":
        return (kind, draw(_task), draw(_id_sel), draw(_epoch_sel), draw(st.booleans()), draw(st.integers(0, 100)),
                draw(st.integers(0, 3)))
    if kind == "compacted":
        return kind, draw(st.booleans())
    if kind == "ack_every_task":  # one ack per task, in a row
        return kind, draw(_epoch_sel), draw(st.booleans())
    if kind == "decline":
        return kind, draw(_task), draw(_id_sel), draw(_epoch_sel)
    if kind in ("stored", "store_failed"):
        return kind, draw(_id_sel)
    if kind == "task_ended":
        return kind, draw(_task)
    return (kind,)


@settings(max_examples=300, deadline=None)
@given(
    events=st.lists(_event(), min_size=20, max_size=100),
    interval_s=st.sampled_from([0, 1, 2.5]),
    timeout_s=st.sampled_from([1, 3, 20]),
    keep=st.integers(1, 3),
    max_failures=st.integers(0, 5),
)
def test_properties_over_random_event_sequences(events, interval_s, timeout_s, keep, max_failures):
    c = CheckpointCoordinator(TASKS, [SRC], interval_s=interval_s, timeout_s=timeout_s, keep=keep,
                              max_consecutive_failures=max_failures, compact_depth=2)
    now = 0.0
    compacting: int | None = None
    undiscarded: set[int] = set()  # abandoned while being stored: kept, pruned later
    c.start(now)
    triggered: dict[int, int] = {}  # id -> epoch
    open_id: int | None = None  # the checkpoint between its Trigger and its Notify/Abandon
    acks_sent: set[tuple[int, int, tuple[int, int]]] = set()
    stored_ids: set[int] = set()
    completed: list[int] = []
    fails = 0

    def pick(sel: str) -> int:
        last = max(triggered, default=1)
        return {"current": last, "previous": last - 1, "next": last + 1}[sel]

    for event in events:
        kind = event[0]
        epoch = c.epoch
        if kind == "tick":
            now += event[1]
            actions = c.tick(now)
        elif kind == "ack":
            _, task, id_sel, epoch_sel, ended, size, depth = event
            cid, ep = pick(id_sel), epoch if epoch_sel == "current" else epoch - 1
            acks_sent.add((cid, ep, task))
            actions = c.ack(cid, ep, task, size, ended, now, depth=depth)
        elif kind == "ack_every_task":
            _, epoch_sel, ended = event
            cid, ep, actions = pick("current"), epoch if epoch_sel == "current" else epoch - 1, []
            for task in TASKS:
                acks_sent.add((cid, ep, task))
                actions += c.ack(cid, ep, task, 1, ended, now)
        elif kind == "decline":
            _, task, id_sel, epoch_sel = event
            actions = c.decline(pick(id_sel), epoch if epoch_sel == "current" else epoch - 1, task, "x", now)
        elif kind == "stored":
            actions = c.stored(pick(event[1]), now)
        elif kind == "store_failed":
            actions = c.store_failed(pick(event[1]), "x", now)
        elif kind == "task_ended":
            actions = c.task_ended(event[1], now)
        elif kind == "compacted":
            actions = c.compacted(compacting if compacting is not None else 99, event[1])
            compacting = None
        else:
            actions = c.restart(epoch + 1, now)
            assert c.epoch == epoch + 1

        for action in actions:
            if isinstance(action, TriggerCheckpoint):
                assert open_id is None, "two checkpoints in flight"
                assert all(action.checkpoint_id > i for i in triggered), "ids must strictly increase"
                assert action.epoch == c.epoch and action.sources == (SRC,)
                triggered[action.checkpoint_id] = action.epoch
                open_id = action.checkpoint_id
            elif isinstance(action, StoreCheckpoint):
                meta = action.meta
                assert meta.checkpoint_id == open_id and meta.checkpoint_id not in stored_ids
                assert meta.epoch == triggered[meta.checkpoint_id]
                assert set(meta.tasks) == set(TASKS)
                assert all((meta.checkpoint_id, meta.epoch, t) in acks_sent for t in TASKS)
                stored_ids.add(meta.checkpoint_id)
            elif isinstance(action, NotifyComplete):
                assert action.checkpoint_id == open_id and action.checkpoint_id in stored_ids
                completed.append(action.checkpoint_id)
                open_id = None
            elif isinstance(action, AbandonCheckpoint):
                assert action.checkpoint_id == open_id
                assert action.discard == (action.checkpoint_id not in stored_ids)  # its record may be written
                if not action.discard:
                    undiscarded.add(action.checkpoint_id)
                open_id = None
            elif isinstance(action, CompactCheckpoint):
                assert compacting is None and action.checkpoint_id == completed[-1]
                compacting = action.checkpoint_id
            elif isinstance(action, PruneCheckpoints):
                assert set(action.checkpoint_ids) <= set(completed[:-keep]) | undiscarded
                assert compacting not in action.checkpoint_ids
            elif isinstance(action, FailApplication):
                fails += 1
        assert c.in_flight == open_id
        assert (c.phase is Phase.IDLE) == (open_id is None)
        assert fails <= 1
        c.check_invariants()
        outcomes = {record.checkpoint_id: record.outcome for record in c.history()}
        assert all(outcomes[i] is Outcome.COMPLETED for i in completed if i in outcomes)
        assert all(outcome is not Outcome.COMPLETED or i in completed for i, outcome in outcomes.items())
        assert set(outcomes) <= set(triggered)
        if completed:
            assert c.latest().checkpoint_id == completed[-1]


def test_a_requested_checkpoint_goes_at_once_or_right_after_the_one_in_flight():
    c = CheckpointCoordinator([(0, 0), (1, 0)], [(0, 0)], interval_s=100, timeout_s=10, keep=2,
                              max_consecutive_failures=3)
    c.start(0.0)
    [trigger] = c.request(1.0)
    assert isinstance(trigger, TriggerCheckpoint) and trigger.checkpoint_id == 1
    assert c.request(1.5) == []  # one in flight: the request waits for it
    c.ack(1, 0, (0, 0), 10, False, 2.0)
    [store] = c.ack(1, 0, (1, 0), 10, False, 2.0)
    actions = c.stored(1, 2.5)
    assert [type(a) for a in actions] == [NotifyComplete, TriggerCheckpoint]
    assert actions[1].checkpoint_id == 2


# -- history ---------------------------------------------------------------------------------

def test_the_history_follows_each_checkpoint_from_trigger_to_completion():
    c = coordinator(interval_s=1)
    [trigger] = c.tick(1.0)
    assert c.history() == (CheckpointRecord(trigger.checkpoint_id, 0, Outcome.IN_PROGRESS, 1.0),)
    c.ack(trigger.checkpoint_id, 0, SRC, 100, False, now=1.2, alignment_s=0.0)
    c.ack(trigger.checkpoint_id, 0, MAP0, 30, False, now=1.3, alignment_s=0.25)
    [record] = c.history()
    assert (record.outcome, record.duration_s, record.size_bytes, record.alignment_s) == \
        (Outcome.IN_PROGRESS, None, 130, 0.25)
    [store] = c.ack(trigger.checkpoint_id, 0, MAP1, 20, False, now=1.4, alignment_s=0.1)
    c.stored(trigger.checkpoint_id, now=1.5)
    [record] = c.history()
    assert record.outcome is Outcome.COMPLETED and record.duration_s == pytest.approx(0.5)
    assert record.task_sizes == ((SRC, 100), (MAP0, 30), (MAP1, 20)) and record.size_bytes == 150
    assert record.alignment_s == 0.25 and record.failure == ""
    c.check_invariants()


@pytest.mark.parametrize("fail, failure", [
    (lambda c, cid: c.decline(cid, 0, MAP0, "disk full", now=2.0), "declined by (1, 0): disk full"),
    (lambda c, cid: c.tick(9.0), "timeout after 5s"),
    (lambda c, cid: (ack_all(c, cid, now=1.5), c.store_failed(cid, "KV gone", now=2.0)), "store failed: KV gone"),
    (lambda c, cid: c.restart(1, now=2.0), "recovery"),
])
def test_a_failed_checkpoint_stays_in_the_history_with_its_reason(fail, failure):
    c = coordinator(interval_s=1)
    [trigger] = c.tick(1.0)
    fail(c, trigger.checkpoint_id)
    [record] = [r for r in c.history() if r.checkpoint_id == trigger.checkpoint_id]
    assert record.outcome is Outcome.FAILED and record.failure == failure and record.duration_s > 0
    c.check_invariants()


def test_the_history_keeps_the_newest_checkpoints_only():
    c = coordinator(interval_s=1)
    now = 0.0
    for _ in range(HISTORY_KEPT + 5):
        now += 1
        [trigger] = c.tick(now)
        complete(c, trigger.checkpoint_id, now)
    ids = [record.checkpoint_id for record in c.history()]
    assert ids == list(range(6, HISTORY_KEPT + 6))
    c.check_invariants()


def test_a_compacted_checkpoint_needs_nothing_older_once_no_task_builds_on_an_older_chain():
    c = coordinator(interval_s=1, timeout_s=100, keep=3, compact_depth=2)

    def checkpoint(cid: int, root: int, depth: int) -> list:
        c.tick(now=cid)
        for task in TASKS:
            c.ack(cid, 0, task, size_bytes=1, ended=False, now=cid, root=root, depth=depth)
        actions = c.stored(cid, now=cid)
        c.check_invariants()
        return actions

    checkpoint(1, 0, 0)
    checkpoint(2, 1, 1)
    assert CompactCheckpoint(3, 0, tuple(sorted(TASKS))) in checkpoint(3, 1, 2)
    assert c.compacted(3, ok=True) == []  # 1 and 2 are kept, and every task's chain starts at 1
    assert checkpoint(4, 3, 1) == [NotifyComplete(4, 0, False, 3)]  # 2 is still kept, and needs 1
    # kept 3 (whole now), 4 and 5, every task building on 3: 1 and 2 go, before 3 leaves
    assert checkpoint(5, 3, 1) == [NotifyComplete(5, 0, False, 3), PruneCheckpoints((1, 2))]


def test_a_checkpoint_abandoned_while_its_record_is_written_keeps_its_snapshots_until_pruned():
    """The record may already name it the app's latest (a relaunched AppMaster restores
    from it): a rollback then must not delete its snapshots at once."""
    c = coordinator(interval_s=1, timeout_s=100, keep=1)
    c.tick(now=1)
    complete(c, 1, now=1)
    c.tick(now=2)
    assert isinstance(ack_all(c, 2, now=2)[-1], StoreCheckpoint)  # its record is being written
    assert c.restart(epoch=1, now=3) == [AbandonCheckpoint(2, "recovery", discard=False)]
    assert c.stored(2, now=3) == [] and c.latest().checkpoint_id == 1
    c.check_invariants()
    c.tick(now=4)
    assert complete(c, 3, now=4) == [NotifyComplete(3, 1, False), PruneCheckpoints((1, 2))]
    c.check_invariants()


# -- parking checkpoints (a rescale's) ---------------------------------------------------------

def parked(interval_s: float = 10) -> CheckpointCoordinator:
    """A coordinator whose parking checkpoint 1 (requested at 1) completed at 2."""
    c = coordinator(interval_s=interval_s, timeout_s=100)
    assert c.request(1, park=True) == [TriggerCheckpoint(1, 0, (SRC,), park=True)]
    c.check_invariants()
    assert complete(c, 1, now=2) == [NotifyComplete(1, 0, False)]
    c.check_invariants()
    return c


def test_after_a_parking_checkpoint_no_tick_triggers_until_the_restart():
    c = parked(interval_s=10)
    assert all(c.tick(now=t) == [] for t in (11, 12, 50, 500))
    c.check_invariants()
    assert c.restart(epoch=1, now=600) == []
    assert c.tick(now=609.9) == []
    assert c.tick(now=610) == [TriggerCheckpoint(2, 1, (SRC,))]  # the interval goes on, not parking
    c.check_invariants()


def test_after_a_parking_checkpoint_a_request_waits_for_the_restart_and_does_not_park():
    """The tasks are parked: a savepoint's checkpoint is taken once the new epoch runs."""
    c = parked()
    assert c.request(3) == [] and c.tick(now=4) == []
    c.check_invariants()
    c.restart(epoch=1, now=5)
    assert c.tick(now=5.1) == [TriggerCheckpoint(2, 1, (SRC,))]
    c.check_invariants()


def test_after_a_parking_checkpoint_the_last_task_ending_triggers_nothing():
    c = parked()
    assert [c.task_ended(task, now=3) for task in TASKS] == [[], [], []]
    assert c.tick(now=4) == []
    c.check_invariants()
    c.restart(epoch=1, now=5)  # the ends were of the epoch before
    assert c.tick(now=6) == [] and c.ended == frozenset()
    c.check_invariants()


def test_a_failed_parking_checkpoint_triggers_nothing_more_until_the_restart():
    c = coordinator(interval_s=1, timeout_s=100)
    c.request(1, park=True)
    assert c.decline(1, 0, MAP0, "disk full", now=2) == [AbandonCheckpoint(1, "declined by (1, 0): disk full")]
    assert c.tick(now=50) == [] and c.request(51) == []
    c.check_invariants()
    c.restart(epoch=1, now=52)
    assert c.tick(now=52.1) == [TriggerCheckpoint(2, 1, (SRC,))]
    c.check_invariants()


def test_a_parking_checkpoint_is_retriggered_with_park():
    c = coordinator(interval_s=10, timeout_s=100)
    c.request(1, park=True)
    assert c.tick(now=2) == [RetriggerCheckpoint(1, 0, park=True)]
    c.check_invariants()


def test_a_parking_request_while_one_is_in_flight_parks_the_next_one():
    c = coordinator(interval_s=10, timeout_s=100)
    assert c.tick(now=10) == [TriggerCheckpoint(1, 0, (SRC,))]
    assert c.request(11, park=True) == []
    assert c.tick(now=12) == [RetriggerCheckpoint(1, 0)]  # the one in flight does not park
    assert complete(c, 1, now=13) == [NotifyComplete(1, 0, False), TriggerCheckpoint(2, 0, (SRC,), park=True)]
    c.check_invariants()


def test_the_final_checkpoint_never_parks():
    """Once every task ended the app ends: nothing would unpark the tasks."""
    c = coordinator(interval_s=10, timeout_s=100)
    c.tick(now=10)
    assert c.request(11, park=True) == []
    for task in TASKS:
        c.task_ended(task, now=12)
    [_, final] = complete(c, 1, now=13)
    assert final == TriggerCheckpoint(2, 0, (SRC,), park=False)
    c.check_invariants()
    assert complete(c, 2, now=14, ended=True) == [NotifyComplete(2, 0, True)]
    c.check_invariants()
