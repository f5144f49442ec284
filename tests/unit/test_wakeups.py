"""Processing-time wakeups: chained ops ask for them and the chain routes what they emit
through the ops after them; the core fires them until the input ends; the TestRunner's
engine fires them on its own clock, the same way every run."""

from __future__ import annotations

from gearbus import CollectSink, Pipeline, Record, Task
from gearbus.api.graph import Processor
from gearbus.api.task import TaskContext
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runners import TestRunner
from gearbus.runtime.chain import ChainTask, MapOp, Op
from gearbus.runtime.core import Flush, Frame, TaskCore

A = (0, 0)


class Delay(Op):
    """Holds records until ``delay_ms`` of processing time after the first of them."""

    def __init__(self, step: str, delay_ms: int):
        super().__init__(step)
        self.delay_ms = delay_ms
        self.held: list = []
        self.due: int | None = None

    def open(self, task):
        self.clock = task.context.now_ms

    def process(self, records):
        if self.due is None:
            self.due = self.clock() + self.delay_ms
        self.held += records
        return []

    def next_wakeup_ms(self):
        return self.due

    def on_wakeup(self, now_ms):
        held, self.held, self.due = self.held, [], None
        return held


def chain(now: list[int]) -> TaskCore:
    """Delay(100) -> add one -> Delay(50) -> times ten, on a clock the test moves."""
    ops = [Delay("first", 100), MapOp("plus_one", lambda v: v + 1), Delay("second", 50),
           MapOp("times_ten", lambda v: v * 10)]
    processor = Processor(ChainTask, 1, "chain", {"ops": ops, "steps": [op.step for op in ops]})
    processor.id = 1
    task = ChainTask(TaskContext(1, "app", processor, 0, 0, clock=lambda: now[0]))
    task.on_start()
    return TaskCore(task, [A], 100)


def frame(seq: int, values=(), watermark=WATERMARK_MIN, eos=False) -> Frame:
    return Frame(*A, 0, seq, watermark, eos, 0, [Record(v, 1) for v in values])


def test_due_ops_fire_in_chain_order_and_their_output_goes_through_the_ops_after_them():
    now = [1000]
    core = chain(now)
    assert core.next_wakeup_ms() is None
    core.receive(A, frame(1, [1, 2]))
    assert core.next_wakeup_ms() == 1100
    now[0] = 1100
    assert core.wakeup(1100) == [Flush([], WATERMARK_MIN)]  # into the second delay, due in 50 ms
    assert core.next_wakeup_ms() == 1150
    core.receive(A, frame(2, [3], watermark=7))
    assert core.next_wakeup_ms() == 1150
    now[0] = 1200
    assert core.wakeup(1200) == [Flush([Record(20, 1), Record(30, 1), Record(40, 1)], 7)]
    assert core.next_wakeup_ms() is None


def test_wakeups_are_not_waited_for_once_the_input_ended():
    now = [0]
    core = chain(now)
    core.receive(A, frame(1, [1]))
    assert core.next_wakeup_ms() == 100
    assert [type(a).__name__ for a in core.receive(A, frame(2, eos=True, watermark=WATERMARK_MAX))] == ["End"]
    assert core.next_wakeup_ms() is None and core.wakeup(100) == []


class Pulse(Task):
    """Counts its records and, every 3 s of processing time from the first, emits the
    count so far and the time since that first record."""

    def on_start(self):
        self.count, self.first, self.due = 0, None, None

    def on_batch(self, records):
        if self.first is None:
            self.first = self.due = self.context.now_ms()
        self.count += len(records)

    def next_wakeup_ms(self):
        return None if self.due is None else self.due + 3000

    def on_wakeup(self, now_ms):
        self.due = now_ms
        self.emit(("pulse", self.count, now_ms - self.first))

    def on_end(self):
        self.emit(("end", self.count))


def pulses(seed: int) -> list:
    out = []
    p = Pipeline("pulses", config={"batch_records": 5})
    p.from_collection(range(100), name="read").process(Pulse, name="pulse").sink(CollectSink(out), name="out")
    TestRunner(seed=seed).run(p)
    return out


def test_the_test_runner_fires_wakeups_on_its_clock_the_same_way_every_run():
    out = pulses(seed=3)
    assert out == pulses(seed=3)
    ticks = [r for r in out if r[0] == "pulse"]
    assert len(ticks) >= 5 and out[-1] == ("end", 100)
    assert [gap for _, _, gap in ticks] == [3000 * (i + 1) for i in range(len(ticks))]  # a tick is a second
    assert [n for _, n, _ in ticks] == sorted(n for _, n, _ in ticks) and ticks[-1][1] < 100
