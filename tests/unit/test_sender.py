"""The sender's rules, without a network: what frames go to which receiver, in what order."""

import pytest

from gearbus.api.partitioners import BroadcastPartitioner, CoLocationPartitioner, HashPartitioner, key_owner
from gearbus.api.task import Record
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.chain import ChainedEdge, FilterOp, MapOp, StepError
from gearbus.runtime.core import End, Flush, Snapshot
from gearbus.runtime.frames import FrameReader
from gearbus.control.config import DEBLOAT_TARGET_MS, AppConfig
from gearbus.runtime.sender import Sender
from gearbus.runtime.snapshots import TaskSnapshot


def sender(parallelism: int = 2, partitioner=None, **config) -> Sender:
    return Sender(1, 0, 3, [(partitioner or HashPartitioner(), 2, parallelism)], AppConfig(**config))


def frames(outgoing) -> list[tuple]:
    """(receiver, seq, watermark, eos, barrier, values) per frame, in sending order."""
    return [(o.channel.receiver, o.frame.seq, o.frame.watermark, o.frame.eos, o.frame.barrier,
             [r.value for r in o.frame.records]) for o in outgoing]


def test_the_watermark_rides_the_last_frame_to_each_receiver_and_goes_alone_to_the_others():
    s = sender(parallelism=1, partitioner=BroadcastPartitioner(), batch_records=2)
    assert frames(s.send([Record(v, 0, None) for v in "abcde"], 10)) == [
        ((2, 0), 1, WATERMARK_MIN, False, 0, ["a", "b"]),
        ((2, 0), 2, WATERMARK_MIN, False, 0, ["c", "d"]),
        ((2, 0), 3, 10, False, 0, ["e"]),
    ]
    s = sender(parallelism=2)
    out = frames(s.send([Record("k", 0, None)] * 3, 7))
    assert sorted(len(f[5]) for f in out) == [0, 3]  # one receiver gets the records, the other the watermark alone
    assert all(f[1:5] == (1, 7, False, 0) for f in out)
    assert s.send([], 7) == []  # a watermark that did not move is not sent again


def test_a_chained_edge_runs_each_branchs_steps_and_sends_only_what_they_let_through():
    odd, small = FilterOp("odd", lambda v: v % 2), FilterOp("small", lambda v: v < 7)
    edge = ChainedEdge([([odd, small], CoLocationPartitioner())])
    s = Sender(1, 0, 3, [(edge, 2, 2), (CoLocationPartitioner(), 5, 2)], AppConfig())
    out = frames(s.send([Record(v, 0, None) for v in range(10)], 4))
    assert out == [((2, 0), 1, 4, False, 0, [1, 3, 5]), ((2, 1), 1, 4, False, 0, []),  # the watermark alone
                   ((5, 0), 1, 4, False, 0, list(range(10))), ((5, 1), 1, 4, False, 0, [])]
    assert edge.describe() == "CoLocationPartitioner after odd, small"
    with pytest.raises(StepError, match=r"\(step 'odd' on record 'x'\)"):
        s.send([Record("x", 0, None)], 5)


def test_a_chained_edge_with_two_branches_sends_each_receiver_both_branches_records():
    split = ChainedEdge([([FilterOp("even", lambda v: v % 2 == 0)], CoLocationPartitioner()),
                         ([FilterOp("odd", lambda v: v % 2), MapOp("neg", lambda v: -v)], CoLocationPartitioner())])
    s = Sender(1, 1, 3, [(split, 2, 2)], AppConfig())
    records = [Record(v, 0, None) for v in range(6)]
    assert frames(s.send(records, 4)) == [((2, 0), 1, 4, False, 0, []), ((2, 1), 1, 4, False, 0, [0, 2, 4, -1, -3, -5])]
    assert [r.value for r in records] == list(range(6))  # the task's own output is left as it was


class EveryOther:
    """A filter with state: keeps every other record it sees."""

    def __init__(self):
        self.seen = 0

    def __call__(self, value) -> bool:
        self.seen += 1
        return self.seen % 2 == 1


def test_each_sender_routes_with_a_partitioner_and_edge_steps_of_its_own():
    edge = ChainedEdge([([FilterOp("every_other", EveryOther())], CoLocationPartitioner())])
    first, second = (Sender(1, 0, 3, [(edge, 2, 1)], AppConfig()) for _ in range(2))
    records = [Record(v, 0, None) for v in range(5)]
    assert frames(first.send(records, 1)) == frames(second.send(records, 1)) == [((2, 0), 1, 1, False, 0, [0, 2, 4])]


def test_a_barrier_follows_the_output_to_every_receiver_with_the_last_watermark():
    s = sender()
    out = frames(s.act(Snapshot(4, TaskSnapshot(4, None, False, 9), False, [Record("k", 0, None)], 9)))
    records, barriers = out[:2], out[2:]
    assert [f[4] for f in records] == [0, 0] and [f[4] for f in barriers] == [4, 4]
    assert all(f[2] == 9 and f[1] == 2 and f[5] == [] for f in barriers)


def test_the_end_sends_the_last_records_then_end_of_stream_with_the_final_watermark():
    s = sender(parallelism=1)
    assert frames(s.act(End([Record("x", 0, None)]))) == [
        ((2, 0), 1, WATERMARK_MAX, False, 0, ["x"]),
        ((2, 0), 2, WATERMARK_MAX, True, 0, []),
    ]


def test_a_frame_over_batch_bytes_is_halved_but_a_lone_large_record_still_goes():
    s = sender(parallelism=1, batch_bytes=2000)
    big = "x" * 1500  # two of them pass batch_bytes
    out = frames(s.act(Flush([Record(big, 0, None)] * 4, 5)))
    assert [len(f[5]) for f in out] == [1, 1, 1, 1]
    assert [f[2] for f in out] == [WATERMARK_MIN, WATERMARK_MIN, WATERMARK_MIN, 5]
    assert len(frames(s.send([Record("y" * 5000, 0, None)], 6))) == 1


def test_credit_bounds_each_channel_and_only_this_attempts_receivers_grant_it():
    s = sender(parallelism=1, credit_frames=2)
    out = [o for v in range(3) for o in s.send([Record(v, 0, None)], WATERMARK_MIN)]
    assert [o.channel.has_credit(o.frame.seq) for o in out] == [True, True, False]
    assert s.grant(2, 0, 2, 1, 2) is None  # another epoch's receiver
    assert s.grant(9, 0, 3, 1, 2) is None  # not a receiver
    assert s.grant(2, 0, 3, 1, 2) is out[2].channel and out[2].channel.has_credit(3)
    assert (s.frames_out, s.records_out) == (3, 3)


def test_a_receivers_window_is_taken_up_to_credit_frames_and_never_shrinks_a_limit_granted():
    s = sender(parallelism=1, credit_frames=4)
    out = [o for v in range(12) for o in s.send([Record(v, 0, None)], WATERMARK_MIN)]
    channel = out[0].channel
    s.grant(2, 0, 3, 2, 2)  # debloated: 2 processed, 2 more
    assert channel.has_credit(4) and not channel.has_credit(5)
    s.grant(2, 0, 3, 3, 1_000)  # a window past credit_frames counts as credit_frames
    assert channel.has_credit(7) and not channel.has_credit(8)
    s.grant(2, 0, 3, 4, 1)  # a smaller window never takes back what was granted
    assert channel.has_credit(7)


def test_the_debloat_target_follows_the_state_backend_unless_the_app_sets_one():
    assert AppConfig.parse({}).resolved().debloat_target_ms == DEBLOAT_TARGET_MS["memory"] == 0
    on_disk = AppConfig.parse({"state_backend": "rocksdb"}).resolved()
    assert on_disk.debloat_target_ms == DEBLOAT_TARGET_MS["rocksdb"] > 0
    assert AppConfig.parse({"state_backend": "rocksdb", "debloat_target_ms": 0}).resolved().debloat_target_ms == 0
    assert AppConfig.parse({"debloat_target_ms": 250}).resolved().debloat_target_ms == 250
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="debloat_target_ms must be a non-negative number"):
            AppConfig.parse({"debloat_target_ms": bad})


def test_a_channel_whose_last_frames_are_unconfirmed_and_quiet_is_probed_with_an_empty_frame():
    s = sender(parallelism=2, partitioner=BroadcastPartitioner(), credit_frames=2)
    s.send([Record("a", 0, None)], 5)  # frame 1 to each receiver
    assert s.probes() == []  # sent since the last look: it may still be on its way
    assert frames(s.probes()) == [((2, 0), 2, 5, False, 0, []), ((2, 1), 2, 5, False, 0, [])]
    s.grant(2, 0, 3, 2, 2)  # receiver 0 processed both: nothing of its can be lost
    assert frames(s.probes()) == []  # receiver 1's probe went out in the last round
    assert frames(s.probes()) == []  # and frame 3 is past its credit (2 unconfirmed of a window of 2)
    s.grant(2, 1, 3, 1, 2)
    assert frames(s.probes()) == [((2, 1), 3, 5, False, 0, [])]
    s.send([], WATERMARK_MAX)
    s.finish(WATERMARK_MAX)
    s.probes()
    assert s.probes() == []  # after end-of-stream: never probed


def test_a_parking_snapshots_barrier_says_park_to_every_receiver_and_only_the_barrier_does():
    s = sender()
    out = s.act(Snapshot(4, TaskSnapshot(4, None, False, 9), False, [Record("k", 0, None)], 9, park=True))
    assert [(o.frame.barrier, o.frame.park) for o in out] == [(0, False), (0, False), (4, True), (4, True)]
    assert all(FrameReader().feed(o.data)[1].park == o.frame.park for o in out)  # on the wire as well
    assert [o.frame.park for o in s.barrier(5)] == [False, False]


def test_a_rewired_sender_starts_every_channel_anew_in_the_new_epoch_at_the_new_parallelism():
    s = sender(parallelism=2)
    s.send([Record(k, 0, k) for k in range(20)], 5)
    partitioner = s.ports[0][0]
    for parallelism, epoch in ((4, 4), (1, 5)):
        s.rewire(epoch, [(HashPartitioner(), 2, parallelism)])
        assert sorted(s.channels) == [(2, i) for i in range(parallelism)] and s.ports[0][0] is partitioner
        out = s.send([Record(k, 0, k) for k in range(20)], 6)
        assert {o.frame.seq for o in out} == {1} and {o.frame.epoch for o in out} == {epoch}
        assert len(out) == parallelism  # the watermark to each receiver, records or not
        assert all(key_owner(r.key, parallelism) == o.channel.receiver[1] for o in out for r in o.frame.records)
        assert sum(len(o.frame.records) for o in out) == 20
    assert s.grant(2, 0, 4, 1, 2) is None  # a receiver of the epoch before
    assert s.grant(2, 0, 5, 1, 2) is s.channels[(2, 0)]


def test_a_rewired_sender_keeps_what_its_edge_steps_hold():
    edge = ChainedEdge([([FilterOp("every_other", EveryOther())], CoLocationPartitioner())])
    s = Sender(1, 0, 3, [(edge, 2, 1)], AppConfig())
    assert frames(s.send([Record("a", 0, None)], 1)) == [((2, 0), 1, 1, False, 0, ["a"])]
    fresh = ChainedEdge([([FilterOp("every_other", EveryOther())], CoLocationPartitioner())])
    s.rewire(4, [(fresh, 2, 1)])
    assert frames(s.send([Record("b", 0, None), Record("c", 0, None)], 2)) == [((2, 0), 1, 2, False, 0, ["c"])]


@pytest.mark.parametrize("edges", [[(HashPartitioner(), 7, 2)], [(HashPartitioner(), 2, 2), (HashPartitioner(), 7, 2)],
                                   []], ids=["another", "one_more", "none"])
def test_a_sender_rewired_to_other_downstream_processors_is_refused_and_left_as_it_was(edges):
    s = sender(parallelism=2)
    channels = dict(s.channels)
    with pytest.raises(ValueError, match="rewired to other downstream processors"):
        s.rewire(4, edges)
    assert s.epoch == 3 and s.channels == channels
