"""Joins and keyed state on the SparkRunner: the bus runtime's own operators
(WindowJoinOp, IntervalJoinOp, TableJoinOp, KeyedProcessOp, StatefulMapOp, and
JoinInputOp for the keys), driven inside Spark as one of the bus's tasks drives them.

The records are partitioned by key (``repartitionAndSortWithinPartitions``); each Spark
partition is one task of the step: a fresh ChainTask around the operator, fed its
records in one deterministic order that the bus could also take, with the watermark
advancing through the values the bus's task would see:

- each input's records arrive in input order, each with the watermark in force at its
  arrival (the source's watermark after the batch before it, as for windows);
- a task's records are sorted by (that watermark, side, input position): the bus's
  interleaving in which the input whose next batch arrived under the lower watermark
  delivers first, the left one on a tie. In it the join's watermark (the lower of its
  inputs') is, at every record, the record's own arrival watermark, so a record within
  its source's out-of-orderness is never late, as on the bus;
- before each record the task goes through every watermark up to its arrival one, and
  at the end through the rest and WATERMARK_MAX: each input's arrival watermarks and the
  one its source reaches after its last batch, in order (a task of the bus sees each of
  them, in every partition, whether or not it holds records of that moment).

The output goes on as ``(value, timestamp, key, watermark)``: the operator's record with
the watermark in force when it was emitted (what the next step's task holds then), and
the step's setting says every watermark the step went through, so a stateful step
downstream goes through them too.

Processing-time timers cannot be translated: a bounded batch job has no processing time
that means anything about the data (a timer would fire, or not, depending on how fast
Spark ran). Which functions register them cannot be known before they run, so the first
registration fails the job, naming the step and the record. ``ctx.processing_time()``
reads the worker's clock, as a task's reads its own.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from functools import partial
from itertools import groupby, islice

from gearbus.api.steps import Join, KeyedStep, Step
from gearbus.api.graph import Processor
from gearbus.api.task import TaskContext
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.planner import join_operator, keyed_operator
from gearbus.runners.spark_records import CARRIED, StepFailure
from gearbus.runtime.chain import ChainTask, Op, StepError
from gearbus.runtime.joins import JoinInputOp
from gearbus.runtime.keyed import KeyedProcessOp, Timers


class Passed(str):
    """A stateful step's watermark setting: CARRIED (its records carry the watermark in force
    when they were emitted), with every watermark its tasks went through, records or not."""

    watermarks: list[int]

    def __new__(cls, watermarks: list[int]):
        passed = super().__new__(cls, CARRIED)
        passed.watermarks = watermarks
        return passed


class NoProcessingTime(Timers):
    """A keyed step's processing-time timers on Spark: registering one fails (the operator
    names the step and the record)."""

    def register(self, key, timestamp: int) -> None:
        raise NotImplementedError("processing-time timers are not supported on the spark runner: a bounded batch "
                                  "job has no processing time that means anything about the data (use event-time "
                                  "timers)")


def join(plan, step: Join) -> None:
    """Both inputs keyed and side-tagged by the bus's JoinInputOp, then the join's operator
    per key partition."""
    operator = join_operator(step)
    inputs, watermarks = [], set()
    for side, (input_step, key_fn) in enumerate(zip(step.inputs, step.keys)):
        arrivals, passed = _arrivals(plan, input_step)
        watermarks |= passed
        inputs.append(arrivals.mapPartitions(partial(_keyed, JoinInputOp(step.name, side, key_fn), plan.batch)))
    _drive(plan, step, operator, plan.sc.union(inputs), watermarks)


def keyed(plan, step: KeyedStep) -> None:
    """``stateful_map`` and ``process_keyed``: the step's operator per key partition."""
    operator = keyed_operator(step)
    if isinstance(operator, KeyedProcessOp):
        operator.processing_timers = NoProcessingTime(operator.changes.changed)
    arrivals, watermarks = _arrivals(plan, step.inputs[0])
    _drive(plan, step, operator, arrivals.map(lambda a: ((a[1], 0, a[2], a[0][2]), a[0])), watermarks)


def _arrivals(plan, step: Step):
    """``step``'s records as (record, watermark in force at its arrival, input position),
    and the watermarks a task reading them goes through (WATERMARK_MIN aside)."""
    setting = plan.watermarks.get(step)
    arrivals, passed = plan._watermarked(plan.rdds[step], setting)
    if isinstance(setting, Passed):
        passed = setting.watermarks
    elif passed is None:  # carried from a JetStream source: the records know them
        passed = arrivals.map(lambda a: a[1]).distinct().collect()
    return arrivals, set(passed) - {WATERMARK_MIN}


def _keyed(keying: JoinInputOp, batch: int, arrivals: Iterable) -> Iterator:
    """One input's records keyed and side-tagged, each under its sort key (arrival
    watermark, side, position, join key)."""
    for chunk in _chunks(arrivals, batch):
        try:
            records = keying.process([arrival[0] for arrival in chunk])
        except StepError as error:
            raise _failure(error) from error
        for (_, watermark, position), record in zip(chunk, records):
            yield (watermark, keying.side, position, record[2]), record


def _drive(plan, step: Step, operator: Op, tagged, watermarks: set[int]) -> None:
    """``tagged``: (sort key, record) pairs; each partition of them, by join key and in
    sort-key order, through one task of the step."""
    passed = sorted(watermarks)
    partitions = plan.sc.defaultParallelism
    ordered = tagged.repartitionAndSortWithinPartitions(partitions, _partition)
    through = plan.sc.broadcast(passed + [WATERMARK_MAX])
    plan.rdds[step] = ordered.mapPartitionsWithIndex(partial(_run, plan.pipeline.name, partitions, plan.batch,
                                                             operator, through))
    plan.watermarks[step] = Passed(passed)


def _partition(tag: tuple) -> int:
    from pyspark.rdd import portable_hash  # as Spark hashes keys (None and tuples alike in every worker)

    return portable_hash(tag[3])


class _Task:
    """A Spark partition as one of the step's tasks on the bus: a ChainTask around the
    operator, and the watermarks it is still to go through."""

    def __init__(self, app: str, partitions: int, index: int, operator: Op, watermarks: list[int]):
        processor = Processor(ChainTask, partitions, operator.step, {"ops": [operator], "steps": [operator.step]})
        self.task = ChainTask(TaskContext(0, app, processor, index, 0))
        self.watermarks = iter(watermarks)
        self.ahead = next(self.watermarks)
        self.watermark = WATERMARK_MIN
        self.task.on_start()

    def process(self, records: list) -> list:
        self.task.on_batch(records)
        return self._emitted(self.watermark)

    def advance(self, until: int) -> list:
        """Go through the watermarks up to ``until``."""
        out = []
        while self.ahead is not None and self.ahead <= until:
            self.task.on_watermark(self.ahead)
            out += self._emitted(self.watermark)
            self.watermark, self.ahead = self.ahead, next(self.watermarks, None)
        return out

    def _emitted(self, watermark: int) -> list:
        """The task's output so far, each record with the watermark downstream holds as it arrives."""
        output, self.task.output = self.task.output, []
        return [(r[0], r[1], r[2], watermark) for r in output]


def _run(app: str, partitions: int, batch: int, operator: Op, watermarks, index: int, tagged: Iterable) -> Iterator:
    """Partition ``index`` (its records in sort-key order) through one task of the step."""
    task = _Task(app, partitions, index, operator, watermarks.value)
    try:
        for arrival, group in groupby(tagged, key=lambda item: item[0][0]):
            yield from task.advance(arrival)
            for chunk in _chunks(group, batch):
                yield from task.process([record for _, record in chunk])
        yield from task.advance(WATERMARK_MAX)
    except StepError as error:
        raise _failure(error) from error
    finally:
        task.task.on_stop()


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    items = iter(items)
    while chunk := list(islice(items, size)):
        yield chunk


def _failure(error: StepError) -> StepFailure:
    """A runtime operator's failure as the Spark runner reports user code's."""
    return StepFailure(error.step, error.value, error.original)
