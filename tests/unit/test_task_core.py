"""The task core without NATS: sequences, epochs, watermarks, end-of-stream, credit,
barrier alignment, snapshots and restore."""

import pytest

from gearbus.api.graph import Processor
from gearbus.api.task import Record, Task, TaskContext
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.core import (DEBLOAT_FRAMES, MIN_WINDOW, DataPlaneError, End, Flush, Frame, Grant, Snapshot,
                                  TaskCore, debloated_window)
from gearbus.runtime.snapshots import TaskSnapshot
from gearbus.runtime.source import SourceLoop

A, B = (0, 0), (0, 1)


class Summing(Task):
    """Sums values; its state is the sum. Records every call, for the assertions."""

    def on_start(self):
        self.total = 0
        self.calls = []

    def on_batch(self, records):
        self.total += sum(r.value for r in records)
        self.calls.append(("batch", [r.value for r in records]))

    def on_watermark(self, watermark):
        self.calls.append(("watermark", watermark))

    def on_end(self):
        self.calls.append(("end",))
        self.emit(self.total)

    def snapshot(self):
        return self.total

    def restore(self, state):
        self.total = state


def make_core(senders=(A, B), credit=4, epoch=0, debloat_target_ms=0, hold_from=None):
    task = Summing(TaskContext(1, "app", _processor(), 0, 0))
    task.on_start()
    return task, TaskCore(task, senders, credit, epoch, debloat_target_ms=debloat_target_ms, hold_from=hold_from)


def _processor():
    processor = Processor(Summing, 1, "sum")
    processor.id = 1
    return processor


class Channel:
    """Frames from one sender, numbered in order."""

    def __init__(self, sender, epoch=0):
        self.sender, self.epoch, self.seq = sender, epoch, 0

    def frame(self, values=(), watermark=WATERMARK_MIN, eos=False, barrier=0, timestamps=None, park=False):
        """``timestamps``: each value's event time (default 1)."""
        self.seq += 1
        records = [Record(v, t) for v, t in zip(values, timestamps or [1] * len(values))]
        return Frame(*self.sender, self.epoch, self.seq, watermark, eos, barrier, records, park)


def test_records_then_watermark_then_end_with_the_minimum_over_inputs():
    task, core = make_core(credit=100)
    a, b = Channel(A), Channel(B)
    assert core.receive(A, a.frame([1, 2], watermark=10)) == []  # B still at -inf
    assert core.receive(B, b.frame([3], watermark=5)) == [Flush([], 5)]
    assert core.receive(A, a.frame([], watermark=WATERMARK_MAX, eos=True)) == []
    actions = core.receive(B, b.frame([4], watermark=WATERMARK_MAX, eos=True))
    assert actions == [End([Record(10, 1)])]  # the final watermark goes out with end-of-stream
    assert task.calls == [("batch", [1, 2]), ("batch", [3]), ("watermark", 5), ("batch", [4]),
                          ("watermark", WATERMARK_MAX), ("end",)]
    assert core.ended and core.watermark == WATERMARK_MAX and task.output == []


def test_a_gap_in_sequence_numbers_means_lost_frames():
    _, core = make_core()
    a = Channel(A)
    core.receive(A, a.frame([1]))
    a.seq += 1  # one frame never arrives
    with pytest.raises(DataPlaneError, match="frames were lost"):
        core.receive(A, a.frame([2]))


def test_frames_of_another_epoch_are_dropped_unread_and_uncredited():
    task, core = make_core(epoch=2)
    zombie, newer = Channel(A, epoch=1), Channel(A, epoch=3)
    assert core.receive(A, zombie.frame([100])) == []
    assert core.receive(A, newer.frame([100])) == []
    assert core.stale_frames == 2 and task.total == 0
    assert core.receive(A, Channel(A, epoch=2).frame([1])) == [] and task.total == 1


def test_credit_goes_back_as_a_running_count_every_half_window():
    _, core = make_core(credit=4)
    a = Channel(A)
    assert core.receive(A, a.frame([1])) == []
    assert core.receive(A, a.frame([1])) == [Grant(A, 2, 4)]
    assert core.receive(A, a.frame([1])) == []
    assert core.receive(A, a.frame([1])) == [Grant(A, 4, 4)]  # the count so far, not an increment


def test_a_debloated_window_is_what_the_task_processes_in_the_target_shared_by_its_inputs():
    # 10,000 records in 1 s: 1,000 in the 100 ms target, frames of 100, two inputs
    assert debloated_window(10_000, 100, 1.0, 0.1, 2, 16) == 5
    assert debloated_window(10_000, 100, 1.0, 0.1, 1, 16) == 10
    assert debloated_window(10_000, 100, 0.01, 0.1, 1, 16) == 16  # fast: never past credit_frames
    assert debloated_window(10_000, 100, 100.0, 0.1, 1, 16) == MIN_WINDOW  # slow: one frame in flight and one to process
    assert debloated_window(0, 100, 1.0, 0.1, 1, 16) == debloated_window(10, 1, 0.0, 0.1, 1, 16) == 16  # nothing measured


def test_a_slow_task_grants_a_smaller_window_and_a_window_that_grew_at_once():
    _, core = make_core(senders=(A,), credit=16, debloat_target_ms=100)
    a = Channel(A)

    def frames(count: int, seconds: float) -> list:
        grants = []
        for _ in range(count):
            grants += core.receive(A, a.frame([1] * 100))
            core.measured(seconds)
        return grants

    assert frames(DEBLOAT_FRAMES, 0.025) == [Grant(A, 8, 16), Grant(A, 16, 16)]  # 4 frames in 100 ms
    assert core.window == 4
    # every half window processed, each carrying it (the sender holds credit up to 32 already)
    assert frames(DEBLOAT_FRAMES, 0.025) == [Grant(A, n, 4) for n in range(18, 33, 2)]
    assert core.repeat_grants() == [Grant(A, 32, 4)]
    frames(DEBLOAT_FRAMES, 0.0001)  # fast again
    assert core.window == 16
    assert frames(1, 0.0001) == [Grant(A, 49, 16)]  # not only after half of it went at the smaller pace


@pytest.mark.parametrize("window", range(2, 10))
def test_one_grant_lost_never_leaves_a_sender_without_credit_whatever_the_window(window):
    _, core = make_core(senders=(A,), credit=window)
    a = Channel(A)
    limit, lost = window, None  # the sender's, as Sender.grant keeps it
    for seq in range(1, 10 * window):
        assert seq <= limit, f"the sender stalled at frame {seq} after grant {lost} was lost"
        for grant in core.receive(A, a.frame([1])):
            if lost is None:
                lost = grant
                continue
            limit = max(limit, grant.consumed + grant.window)


def test_without_a_debloat_target_the_window_stays_whole_however_slow():
    _, core = make_core(senders=(A,), credit=4)
    a = Channel(A)
    for _ in range(DEBLOAT_FRAMES * 2):
        core.receive(A, a.frame([1]))
        core.measured(10.0)
    assert core.window == 4


def test_an_idle_task_repeats_its_counts_to_every_open_input():
    _, core = make_core(senders=(A, B, (0, 2)), credit=4)
    a, b, c = Channel(A), Channel(B), Channel((0, 2))
    core.receive(A, a.frame([1]))  # one frame not yet credited back
    core.receive(B, b.frame([], barrier=3))  # B is held until A and C bring barrier 3
    core.receive(B, b.frame([7]))  # held: received, not yet processed, so not counted
    core.receive((0, 2), c.frame([], eos=True))
    assert core.repeat_grants() == [Grant(A, 1, 4), Grant(B, 1, 4)]
    assert core.repeat_grants() == [Grant(A, 1, 4), Grant(B, 1, 4)]  # the same counts again: harmless
    assert core.receive(A, a.frame([1])) == []  # 2 processed, 1 granted: not yet half a window


def test_barriers_align_holding_back_the_channel_that_is_ahead():
    task, core = make_core(credit=100)
    a, b = Channel(A), Channel(B)
    core.receive(A, a.frame([1]))
    assert core.receive(A, a.frame([], barrier=7)) == []
    assert core.receive(A, a.frame([1000])) == []  # after A's barrier: held back
    assert task.total == 1
    core.receive(B, b.frame([2]))
    actions = core.receive(B, b.frame([], barrier=7))
    snapshots = [x for x in actions if type(x) is Snapshot]
    assert snapshots == [Snapshot(7, TaskSnapshot(7, 3, False, WATERMARK_MIN, epoch=0, root=7),
                                  False, [], WATERMARK_MIN, records_in=2)]  # the held record comes after it
    assert task.total == 1003  # the held frame was processed after the snapshot


def test_held_frames_are_not_credited_until_released():
    _, core = make_core(credit=2)
    a, b = Channel(A), Channel(B)
    assert core.receive(A, a.frame([], barrier=1)) == [Grant(A, 1, 2)]
    assert core.receive(A, a.frame([5])) == []  # held: no credit for it yet
    actions = core.receive(B, b.frame([], barrier=1))
    assert Grant(A, 2, 2) in actions and Grant(B, 1, 2) in actions


def test_the_next_barrier_on_a_held_channel_holds_it_again():
    task, core = make_core(credit=100)
    a, b = Channel(A), Channel(B)
    core.receive(A, a.frame([], barrier=1))
    core.receive(A, a.frame([10]))
    core.receive(A, a.frame([], barrier=2))
    core.receive(A, a.frame([20]))
    first = core.receive(B, b.frame([1], barrier=1))
    assert [x.checkpoint_id for x in first if type(x) is Snapshot] == [1]
    assert task.total == 11  # A's 10 ran; A's 20 waits behind barrier 2
    second = core.receive(B, b.frame([2], barrier=2))
    assert [(x.checkpoint_id, x.state.state) for x in second if type(x) is Snapshot] == [(2, 13)]
    assert task.total == 33


def test_an_ended_task_still_answers_barriers_and_says_it_ended():
    task, core = make_core()
    a, b = Channel(A), Channel(B)
    core.receive(A, a.frame([1], watermark=WATERMARK_MAX, eos=True))
    core.receive(B, b.frame([2], watermark=WATERMARK_MAX, eos=True))
    assert core.ended
    core.receive(A, a.frame([], barrier=9))
    [snapshot] = [x for x in core.receive(B, b.frame([], barrier=9)) if type(x) is Snapshot]
    assert snapshot.ended and snapshot.state.ended and snapshot.state.state == 3


def test_end_of_stream_held_behind_a_barrier_comes_after_the_snapshot():
    task, core = make_core()
    a, b = Channel(A), Channel(B)
    core.receive(A, a.frame([], barrier=4))
    core.receive(A, a.frame([1], watermark=WATERMARK_MAX, eos=True))  # held
    core.receive(B, b.frame([], watermark=WATERMARK_MAX, eos=True))
    actions = core.receive(B, b.frame([], barrier=4))
    assert [type(x).__name__ for x in actions if type(x) in (Snapshot, End)] == ["Snapshot", "End"]
    assert not actions[[type(x) for x in actions].index(Snapshot)].ended


def test_restore_resumes_the_state_and_a_task_that_had_ended_does_not_end_twice():
    task, core = make_core()
    core.restore(TaskSnapshot(5, 41, True, WATERMARK_MAX))
    assert task.total == 41 and core.ended and core.last_checkpoint == 5
    a, b = Channel(A), Channel(B)
    assert core.receive(A, a.frame([], watermark=WATERMARK_MAX, eos=True)) == []
    assert core.receive(B, b.frame([], watermark=WATERMARK_MAX, eos=True)) == []
    assert ("end",) not in task.calls
    assert core.inject_barrier(5) == []  # an id it already passed


def test_a_source_snapshots_where_the_barrier_is_injected_and_ends_with_the_final_watermark():
    task, core = make_core(senders=())
    assert core.advance_source(100) == [Flush([], 100)]
    [snapshot] = core.inject_barrier(3)
    assert snapshot.checkpoint_id == 3 and snapshot.state.watermark == 100
    assert core.end_source() == [End([Record(0, 0)])]
    assert task.calls[-2:] == [("watermark", WATERMARK_MAX), ("end",)]


class Echo(Task):
    def on_batch(self, records):
        self.output.extend(records)


def test_output_of_frames_held_behind_a_barrier_follows_the_barrier():
    """Completing the alignment releases held frames in the same event: their output
    must not be sent before the barrier (it would be counted twice after a restore)."""
    task = Echo(TaskContext(1, "app", _processor(), 0, 0))
    core = TaskCore(task, (A, B), 100)
    a, b = Channel(A), Channel(B)
    core.receive(A, a.frame([1]))
    core.receive(A, a.frame([], barrier=3))
    core.receive(A, a.frame([2]))  # after the barrier: held
    actions = core.receive(B, b.frame([], barrier=3))
    [snapshot] = [x for x in actions if type(x) is Snapshot]
    assert [r.value for r in snapshot.records] == [1]  # only what came before the barrier
    assert [r.value for r in task.output] == [2]  # the held frame's output waits for the next send


def test_a_task_whose_snapshots_are_whole_builds_no_chain():
    """A task that keeps no track of changes snapshots all it holds every time: each
    snapshot is whole and stands alone (depth 0, its own root), so the AppMaster never
    compacts it and a restore reads one snapshot."""
    task, core = make_core(senders=(A,), credit=100)
    a = Channel(A)
    for checkpoint_id in (1, 2, 3):
        core.receive(A, a.frame([checkpoint_id]))
        [snapshot] = [x for x in core.receive(A, a.frame([], barrier=checkpoint_id)) if type(x) is Snapshot]
        assert (snapshot.state.base, snapshot.state.depth, snapshot.state.root) == (None, 0, checkpoint_id)
        core.completed(checkpoint_id)


def test_records_from_the_hold_time_on_wait_in_the_snapshot_for_the_next_code_which_takes_them_first():
    task, core = make_core(senders=(A,), hold_from=100)
    a = Channel(A)
    core.receive(A, a.frame([1, 2, 3], watermark=50, timestamps=[40, 100, 120]))
    core.receive(A, a.frame([4], watermark=130, timestamps=[90]))  # behind the hold time: this code's
    assert task.total == 5 and [c for c in task.calls if c[0] == "watermark"] == [("watermark", 50), ("watermark", 99)]
    assert core.output_watermark == 99  # nothing downstream passes a held record
    [snapshot] = [x for x in core.receive(A, a.frame([], watermark=130, barrier=4)) if type(x) is Snapshot]
    assert snapshot.state.held == (100, (Record(2, 100), Record(3, 120))) and snapshot.state.watermark == 130
    decoded = TaskSnapshot.decode(snapshot.state.encode())
    assert decoded == snapshot.state  # envelope format 5 keeps them
    after, restored = make_core(senders=(A,))  # the new code's task
    restored.restore(decoded)
    assert after.total == 5 + 5 and after.calls[-2:] == [("batch", [2, 3]), ("watermark", 130)]
    assert restored.records_in == 2 and restored.output_watermark == 130


def test_records_held_when_the_input_ends_go_to_this_code():
    task, core = make_core(senders=(A,), hold_from=100)
    a = Channel(A)
    core.receive(A, a.frame([1, 2], watermark=60, timestamps=[50, 150]))
    actions = core.receive(A, a.frame([], watermark=WATERMARK_MAX, eos=True))
    assert task.total == 3 and ("batch", [2]) in task.calls and ("watermark", WATERMARK_MAX) in task.calls
    assert actions[-1] == End([Record(3, 150)])  # emitted at the last record's time


# --- parking at a rescale's checkpoint ----------------------------------------------------


class Waking(Summing):
    """Wants a wakeup at 50 ms; records its wakeups and polls."""

    def next_wakeup_ms(self):
        return 50

    def on_wakeup(self, now_ms):
        self.calls.append(("wakeup", now_ms))

    def poll(self):
        self.calls.append(("poll",))


class Counting(Summing):
    """A source: each read emits the next number, which is also its watermark."""

    def on_start(self):
        super().on_start()
        self.watermark = WATERMARK_MIN

    def read(self, max_records):
        self.total += 1
        self.emit(self.total, timestamp=self.total)
        self.watermark = self.total
        return 1


C = (0, 2)


def parked_core(credit=100):
    """A core over A and B that took [1] and [2] (watermarks 10 and 20), then parked at checkpoint 5."""
    task, core = make_core(credit=credit)
    a, b = Channel(A), Channel(B)
    core.receive(A, a.frame([1], watermark=10))
    core.receive(B, b.frame([2], watermark=20))
    core.receive(A, a.frame([], barrier=5, park=True))
    core.receive(B, b.frame([], barrier=5, park=True))
    assert core.parked
    return task, core, a, b


def test_a_parking_barrier_parks_the_task_after_its_snapshot_holding_what_comes_after_uncredited():
    task, core = make_core(credit=2)  # a window of 2: every frame processed is credited
    a, b = Channel(A), Channel(B)
    assert core.receive(A, a.frame([1])) == [Grant(A, 1, 2)]
    core.receive(A, a.frame([], barrier=5, park=True))
    assert core.receive(A, a.frame([10])) == []  # behind A's barrier while aligning
    actions = core.receive(B, b.frame([2], barrier=5, park=True))
    [snapshot] = [x for x in actions if type(x) is Snapshot]
    assert snapshot.park and snapshot.state.state == 3 and core.parked
    assert task.total == 3  # the frame held while aligning stays held: not released after the snapshot
    assert core.receive(A, a.frame([100])) == [] and core.receive(B, b.frame([200])) == []  # held, no grant
    assert task.total == 3 and core.repeat_grants() == [Grant(A, 2, 2), Grant(B, 1, 2)]  # held ones not counted


def test_a_barrier_without_park_does_not_park():
    _, core = make_core(senders=(A,))
    [snapshot] = [x for x in core.receive(A, Channel(A).frame([], barrier=5)) if type(x) is Snapshot]
    assert not snapshot.park and not core.parked


def test_a_parked_task_fires_no_wakeup_and_polls_nothing():
    task = Waking(TaskContext(1, "app", _processor(), 0, 0))
    task.on_start()
    core = TaskCore(task, (A,), 4)
    assert core.next_wakeup_ms() == 50
    core.receive(A, Channel(A).frame([], barrier=1, park=True))
    assert core.parked and core.next_wakeup_ms() is None
    assert core.wakeup(60) == [] and core.poll() == []
    assert [c for c in task.calls if c[0] in ("wakeup", "poll")] == []


def test_a_rewired_task_drops_the_old_epochs_frames_and_takes_the_new_ones_in_order_once_resumed():
    task, core, a, b = parked_core(credit=2)
    core.receive(A, a.frame([1000]))  # held while parked: of the old epoch, never processed
    core.rewire((A, B, C), epoch=1)
    assert core.receive(A, a.frame([2000])) == [] and core.stale_frames == 1  # the old epoch: dropped
    a1, b1, c1 = Channel(A, epoch=1), Channel(B, epoch=1), Channel(C, epoch=1)  # sequences start at 1 again
    assert core.receive(A, a1.frame([3], watermark=30)) == []
    assert core.receive(C, c1.frame([4], watermark=40)) == []
    assert core.receive(A, a1.frame([6], watermark=35)) == []
    assert core.receive(B, b1.frame([5], watermark=50)) == []  # held until resumed, uncredited
    assert task.total == 3 and core.watermark == 10 and core.parked  # the state and watermark as they were
    actions = core.resume()
    assert not core.parked and task.total == 3 + 3 + 6 + 5 + 4
    assert [c for c in task.calls if c[0] == "batch"][-4:] == [("batch", [3]), ("batch", [6]), ("batch", [5]),
                                                               ("batch", [4])]  # each channel in order
    assert Flush([], 35) in actions and core.watermark == 35  # never back below 10 meanwhile
    assert {x.sender for x in actions if type(x) is Grant} == {A, B, C}
    assert core.receive(A, a1.frame([7])) == [Grant(A, 3, 2)] and task.total == 28  # no longer held


def test_a_rewired_task_aligns_the_next_barrier_over_its_new_senders():
    task, core, a, b = parked_core()
    core.rewire((A, C), epoch=1)
    core.resume()
    a1, c1 = Channel(A, epoch=1), Channel(C, epoch=1)
    assert core.receive(A, a1.frame([], barrier=6)) == []
    [snapshot] = [x for x in core.receive(C, c1.frame([], barrier=6)) if type(x) is Snapshot]
    assert snapshot.state.state == 3 and snapshot.state.epoch == 1 and not core.parked


def test_only_a_parked_task_can_be_rewired():
    _, core = make_core()
    with pytest.raises(DataPlaneError, match="rewired while not parked"):
        core.rewire((A,), epoch=1)
    assert core.epoch == 0 and set(core.inputs) == {A, B}


def test_a_source_parked_by_its_barrier_reads_nothing_until_resumed():
    task = Counting(TaskContext(1, "app", _processor(), 0, 0))
    task.on_start()
    core = TaskCore(task, (), 4)
    loop = SourceLoop(core, 10)
    assert loop.step().count == 1
    loop.inject(2, park=True)
    step = loop.step()
    assert step.count == 0 and [(x.checkpoint_id, x.park) for x in step.actions] == [(2, True)]
    assert core.parked and loop.step() == ([], 0) and task.total == 1  # nothing read
    core.rewire((), epoch=1)
    assert loop.step().count == 0 and core.resume() == [Flush([], 1)]  # its watermark, nothing held
    step = loop.step()
    assert step.count == 1 and task.total == 2 and step.actions[0] == Flush([Record(2, 2)], 2)
