"""map_async: the task core with async calls driven by hand (results later, the watermark
held behind them, the end after the last result, back-pressure, snapshots of what is in
flight), and pipelines on the TestRunner's engine (order, watermarks never overtaken,
timeouts, failures, bounded memory, exactly-once across recoveries), and the DSL's
build-time errors."""

from __future__ import annotations

import asyncio
import collections
import json

import pytest

from gearbus import CollectSink, DataSource, Pipeline, Record, TumblingWindows
from gearbus.api.graph import GraphError, Processor
from gearbus.api.task import NotRescalable, TaskContext
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.planner import describe, plan
from gearbus.runners import PipelineFailed, TestRunner
from gearbus.runners.inprocess import SimulatedCrash
from gearbus.runtime.async_map import AsyncMapOp
from gearbus.runtime.chain import ChainTask, Op
from gearbus.runtime.core import End, Flush, Frame, Snapshot, TaskCore
from gearbus.runtime.snapshots import TaskSnapshot

A = (0, 0)
#: small frames and credit, so tasks fill up, senders wait and frames interleave
CONFIG = {"batch_records": 5, "credit_frames": 2}


async def turns(n: int) -> None:
    """Let the event loop go round ``n`` times: calls finish in an order set by the test,
    not by a clock."""
    for _ in range(n):
        await asyncio.sleep(0)


# --- the core, driven by hand ------------------------------------------------------------


class Seen(Op):
    """Notes what reaches it, in order: the op chained after map_async."""

    def __init__(self, step: str):
        super().__init__(step)
        self.seen: list = []

    def process(self, records):
        self.seen.append([r.value for r in records])
        return records

    def on_watermark(self, watermark):
        self.seen.append(watermark)
        return []


class Gated:
    """An async function whose calls finish when the test opens their gates."""

    def __init__(self):
        self.gates: dict = collections.defaultdict(asyncio.Event)
        self.started: list = []

    def __deepcopy__(self, memo) -> Gated:
        return self  # the task's copy of the step calls this very function

    async def __call__(self, value):
        self.started.append(value)
        await self.gates[value].wait()
        return value * 10

    def open(self, *values) -> None:
        for value in values:
            self.gates[value].set()


class Driver:
    """One ChainTask of ``AsyncMapOp`` -> ``Seen`` under a TaskCore, and its polls."""

    def __init__(self, fn, concurrency: int = 10, ordered: bool = True):
        ops = [AsyncMapOp("lookup", fn, concurrency, ordered, None, None), Seen("seen")]
        processor = Processor(ChainTask, 1, "chain", {"ops": ops, "steps": ["lookup", "seen"]})
        processor.id = 1
        self.polled = asyncio.Event()
        self.task = ChainTask(TaskContext(1, "app", processor, 0, 0, request_poll=self.polled.set))
        self.task.on_start()
        self.core = TaskCore(self.task, [A], 100)
        self.seq = 0

    def frame(self, values=(), watermark=WATERMARK_MIN, eos=False, barrier=0) -> list:
        self.seq += 1
        return self.core.receive(A, Frame(*A, 0, self.seq, watermark, eos, barrier, [Record(v, 1) for v in values]))

    async def poll(self) -> list:
        """Wait for the calls to ask for a poll, then poll."""
        async with asyncio.timeout(5):
            await self.polled.wait()
        self.polled.clear()
        return self.core.poll()

    @property
    def seen(self) -> list:
        return self.task.ops[1].seen


async def test_ordered_results_go_out_in_input_order_with_the_watermark_held_behind_them():
    fn = Gated()
    d = Driver(fn)
    assert d.frame([1, 2, 3], watermark=5) == [Flush([], WATERMARK_MIN)]  # the watermark waits for 1, 2, 3
    assert d.core.pending and d.core.output_watermark == WATERMARK_MIN
    fn.open(3, 2)
    assert await d.poll() == [Flush([], WATERMARK_MIN)]  # 1 is not back: nothing may pass it
    fn.open(1)
    assert await d.poll() == [Flush([Record(10, 1), Record(20, 1), Record(30, 1)], 5)]
    assert d.seen == [[10, 20, 30], 5]  # the op after it saw the results, then the watermark
    assert not d.core.pending and d.core.output_watermark == 5
    assert d.frame([], watermark=7) == [Flush([], 7)]  # nothing before it: it goes on at once


async def test_unordered_results_go_out_as_calls_finish_but_never_across_a_watermark():
    fn = Gated()
    d = Driver(fn, ordered=False)
    d.frame([1, 2], watermark=5)
    d.frame([3], watermark=6)
    fn.open(3, 2)
    assert await d.poll() == [Flush([Record(20, 1)], WATERMARK_MIN)]  # 3 waits behind watermark 5
    fn.open(1)
    assert await d.poll() == [Flush([Record(10, 1), Record(30, 1)], 6)]
    assert d.seen == [[20], [10], 5, [30], 6]


async def test_a_full_task_takes_no_input_and_its_end_follows_its_last_result():
    fn = Gated()
    d = Driver(fn, concurrency=2)
    d.frame([1])
    assert d.core.accepting
    d.frame([2, 3])  # a frame is taken whole: memory is bounded by concurrency + one batch
    await turns(1)
    assert not d.core.accepting and fn.started == [1, 2]  # two calls in flight, 3 waits its turn
    assert d.frame([], watermark=WATERMARK_MAX, eos=True) == [Flush([], WATERMARK_MIN)]
    assert d.core.input_ended and not d.core.ended and d.core.next_wakeup_ms() is None
    fn.open(1, 2, 3)
    actions = await d.poll()
    while not d.core.ended:
        actions += await d.poll()
    assert type(actions[-1]) is End and [r.value for a in actions for r in a.records] == [10, 20, 30]
    assert d.seen[-1] == WATERMARK_MAX


async def test_a_barrier_does_not_wait_for_calls_and_a_restore_calls_them_again():
    fn = Gated()
    d = Driver(fn)
    d.frame([1, 2, 3], watermark=5)
    fn.open(2)
    await d.poll()
    (snapshot,) = d.frame([], watermark=5, barrier=7)
    assert type(snapshot) is Snapshot and snapshot.watermark == WATERMARK_MIN  # the output's watermark
    d.task.on_stop()

    again = Gated()
    restored = Driver(again)
    restored.core.restore(TaskSnapshot.decode(snapshot.state.encode()))
    again.open(1, 3)
    actions = await restored.poll()
    while restored.core.pending:
        actions += await restored.poll()
    assert sorted(again.started) == [1, 3]  # 2 finished before the barrier: its result was kept
    assert [r.value for a in actions for r in a.records] == [10, 20, 30] and actions[-1].watermark == 5


# --- pipelines on the TestRunner ----------------------------------------------------------


async def reversed_in_tens(n: int) -> int:
    """Within each ten, later numbers answer first."""
    await turns(10 - n % 10)
    return n * 2


def numbers(n: int, fn, out: list, parallelism: int = 1, **step) -> Pipeline:
    p = Pipeline("numbers", config=CONFIG, parallelism=parallelism)
    (p.from_collection(range(n), name="read", parallelism=parallelism)
        .map_async(fn, name="lookup", **step).sink(CollectSink(out), name="out"))
    return p


async def test_a_drained_queue_divides_over_other_tasks_and_one_with_calls_in_flight_does_not():
    fn = Gated()
    old = [Driver(fn), Driver(fn)]
    old[0].frame([1], watermark=5)
    fn.open(1)
    await old[0].poll()
    drained = [d.task.ops[0].snapshot() for d in old]
    fresh = Driver(fn)
    fresh.task.ops[0].restore(fresh.task.ops[0].rescale(drained, 0, 3))
    fresh.frame([2], watermark=7)
    fn.open(2)
    await fresh.poll()
    assert fresh.seen == [[20], 7]  # the divided queue runs on
    old[1].frame([3])  # a call in flight
    with pytest.raises(NotRescalable, match="step 'lookup' holds records in flight"):
        fresh.task.ops[0].rescale([d.task.ops[0].snapshot() for d in old], 0, 3)


def test_ordered_output_keeps_the_input_order():
    out = []
    TestRunner().run(numbers(200, reversed_in_tens, out, concurrency=10))
    assert out == [n * 2 for n in range(200)]


def test_unordered_output_comes_as_calls_finish():
    out = []
    TestRunner().run(numbers(200, reversed_in_tens, out, concurrency=10, ordered=False))
    assert sorted(out) == [n * 2 for n in range(200)]
    assert out != [n * 2 for n in range(200)]


EVENTS = [{"key": i % 3, "ts": i * 10} for i in range(400)]


async def late_for_early_events(event: dict) -> dict:
    """Each event in a run of 13 answers after the ones behind it."""
    await turns(13 - event["ts"] // 10 % 13)
    return event


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ordered", [True, False])
def test_a_watermark_never_overtakes_a_result_windows_after_it_are_exact(ordered, seed):
    out, late = [], []
    p = Pipeline("windows", config=CONFIG, parallelism=2)
    (p.from_collection(EVENTS, name="read", parallelism=2, timestamp_fn=lambda e: e["ts"])
        .map_async(late_for_early_events, concurrency=7, ordered=ordered, name="lookup")
        .group_by(lambda e: e["key"], name="by_key")
        .window(TumblingWindows(100), late_sink=CollectSink(late)).count(name="count")
        .map(lambda r: (r.key, r.window_start, r.value), name="row").sink(CollectSink(out), name="out"))
    TestRunner(seed=seed).run(p)
    expected = collections.Counter((e["key"], e["ts"] // 100 * 100) for e in EVENTS)
    assert late == [] and sorted(out) == sorted((k, start, n) for (k, start), n in expected.items())


async def hang_on_three(n: int) -> int:
    if n == 3:
        await asyncio.Event().wait()  # a service that never answers
    return n


def failure(pipeline: Pipeline):
    with pytest.raises(PipelineFailed) as failed:
        TestRunner().run(pipeline)
    return failed.value.error


def test_a_call_past_its_timeout_fails_the_app_naming_the_step_and_record():
    error = failure(numbers(10, hang_on_three, [], timeout_ms=50))
    assert error.error_type == "TimeoutError"
    assert error.message == "the call took longer than timeout_ms=50 (step 'lookup' on record 3)"
    assert error.where == "task read+lookup+out[0] of processor 'read+lookup+out'"


def test_on_timeout_gives_the_result_of_a_call_past_its_timeout():
    out = []
    TestRunner().run(numbers(10, hang_on_three, out, timeout_ms=50, on_timeout=lambda n: -n))
    assert out == [0, 1, 2, -3, 4, 5, 6, 7, 8, 9]


async def refuse_thirteen(n: int) -> int:
    await turns(1)
    if n == 13:
        raise ValueError(f"no customer {n}")
    return n


def test_an_exception_in_the_function_fails_the_app_naming_the_step_and_record():
    error = failure(numbers(50, refuse_thirteen, [], parallelism=2, concurrency=4, ordered=False))
    assert (error.error_type, error.message) == ("ValueError", "no customer 13 (step 'lookup' on record 13)")
    assert "refuse_thirteen" in error.traceback


class Counted(DataSource):
    """Numbers 0..n-1, counting how many were read (over every task)."""

    read_so_far = 0

    def __init__(self, n: int):
        self.n, self.next = n, 0

    def read(self, max_records):
        if self.next >= self.n:
            return None
        batch = list(range(self.next, min(self.next + max_records, self.n)))
        self.next += len(batch)
        Counted.read_so_far += len(batch)
        return [Record(v, 0) for v in batch]


@pytest.mark.parametrize("ordered", [True, False])
def test_back_pressure_bounds_calls_in_flight_and_records_held(ordered):
    out, in_flight, held = [], [0], []

    async def lookup(n: int) -> int:
        in_flight[0] += 1
        held.append((in_flight[0], Counted.read_so_far - len(out)))
        await turns(n % 5)
        in_flight[0] -= 1
        return n

    Counted.read_so_far = 0
    p = Pipeline("pressure", config=CONFIG)
    p.source(Counted(300), name="read").map_async(lookup, concurrency=4, ordered=ordered, name="lookup").sink(
        CollectSink(out), name="out")
    TestRunner().run(p)
    assert sorted(out) == list(range(300))
    assert max(calls for calls, _ in held) == 4
    assert max(records for _, records in held) <= 4 + CONFIG["batch_records"]  # concurrency + one batch


def test_a_full_task_back_pressures_its_senders_through_credit():
    out, in_flight, most, held = [], [0], [0], []

    async def lookup(n: int) -> int:
        in_flight[0] += 1
        most[0] = max(most[0], in_flight[0])
        held.append(Counted.read_so_far - len(out))
        await turns(n % 7)
        in_flight[0] -= 1
        return n

    Counted.read_so_far = 0
    p = Pipeline("shuffled", config=CONFIG)
    (p.source(Counted(300), name="read").map(abs, name="spread", parallelism=2)
        .map_async(lookup, concurrency=3, name="lookup").sink(CollectSink(out), name="out", parallelism=2))
    assert [proc.name for proc in plan(p, "test").graph.processors] == ["read", "spread+lookup+out"]
    TestRunner().run(p)
    assert sorted(out) == list(range(300)) and most[0] <= 2 * 3
    tasks, channels, batch = 2, 2, CONFIG["batch_records"]
    assert max(held) <= tasks * (3 + batch) + channels * CONFIG["credit_frames"] * batch + batch


CALLS = collections.Counter()


async def square(n: int) -> dict:
    CALLS[n] += 1
    await turns(n % 9)
    return {"n": n, "square": n * n}


def squares(path, ordered: bool = True) -> Pipeline:
    p = Pipeline("squares", config=CONFIG, parallelism=3)
    (p.from_collection(range(240), name="read", parallelism=3)
        .map_async(square, concurrency=6, ordered=ordered, name="lookup")
        .write_jsonl(str(path), name="write"))
    return p


def committed(path) -> list[int]:
    return sorted(json.loads(line)["n"] for line in path.read_text().splitlines())


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("ordered", [True, False])
def test_a_killed_executor_rolls_back_and_records_in_flight_give_their_results_exactly_once(
        inprocess, tmp_path, ordered, seed):
    out = tmp_path / "squares.jsonl"
    engine = inprocess(squares(out, ordered), seed=seed, checkpoint_every=2)
    engine.run(kill_executor_after_frames=[15, 45])
    assert committed(out) == list(range(240))
    assert engine.epoch == 2


def test_records_in_flight_at_a_checkpoint_are_called_again_after_a_restore(inprocess, tmp_path):
    out = tmp_path / "squares.jsonl"
    first = inprocess(squares(out), seed=1, checkpoint_every=1)
    with pytest.raises(SimulatedCrash):
        first.run(crash_after_frames=30)
    checkpoint_id, snapshots = first.latest_checkpoint()
    in_flight = sorted(value for key, data in snapshots.items() if key[0] == 0
                       for calls, _ in TaskSnapshot.decode(data).state["steps"]["lookup"]["segments"]
                       for value, _, _, done, _ in calls if not done)
    assert in_flight, "the checkpoint was taken with calls in flight"
    CALLS.clear()
    inprocess(squares(out), seed=2, checkpoint_every=1, epoch=1).run(restore=(checkpoint_id, snapshots))
    assert all(CALLS[n] for n in in_flight)
    assert committed(out) == list(range(240))


# --- the DSL --------------------------------------------------------------------------


async def lookup(value):
    return value


def stream():
    return Pipeline("p").from_collection([1], name="read")


@pytest.mark.parametrize("kwargs, message", [
    ({"async_fn": abs}, "map_async step 'abs': <built-in function abs> is not an async function (async def)"),
    ({"async_fn": lambda v: v, "name": "fetch"}, "map_async step 'fetch': <function"),
    ({"concurrency": 0}, "map_async step 'lookup': concurrency must be an integer >= 1, got 0"),
    ({"concurrency": True}, "map_async step 'lookup': concurrency must be an integer >= 1, got True"),
    ({"concurrency": 2.5}, "map_async step 'lookup': concurrency must be an integer >= 1, got 2.5"),
    ({"ordered": "yes"}, "map_async step 'lookup': ordered must be True or False, got 'yes'"),
    ({"timeout_ms": 0}, "map_async step 'lookup': timeout_ms must be a number > 0 (or None), got 0"),
    ({"timeout_ms": float("inf")}, "map_async step 'lookup': timeout_ms must be a number > 0 (or None), got inf"),
    ({"timeout_ms": "50"}, "map_async step 'lookup': timeout_ms must be a number > 0 (or None), got '50'"),
    ({"on_timeout": abs}, "map_async step 'lookup': on_timeout needs a timeout_ms"),
    ({"timeout_ms": 10, "on_timeout": lookup}, "map_async step 'lookup': on_timeout must be a plain (not async) function"),
])
def test_bad_arguments_fail_at_build_time_naming_the_step(kwargs, message):
    arguments = {"async_fn": lookup, **kwargs}
    with pytest.raises(GraphError) as refused:
        stream().map_async(arguments.pop("async_fn"), **arguments)
    assert str(refused.value).startswith(message)


def test_map_async_is_chained_like_a_map_and_its_step_is_stateful():
    p = Pipeline("chained")
    p.from_collection([1], name="read").map_async(lookup, name="lookup").map(abs, name="abs").sink(
        CollectSink([]), name="out")
    (processor,) = describe(plan(p, "test"))["processors"]
    assert processor["steps"] == ["read", "lookup", "abs", "out"]
    assert processor["operators"] == ["AsyncMapOp", "MapOp", "SinkOp"]
