"""Runs one task inside an executor: its inbox, the input bookkeeping (sequence checks,
watermarks, end-of-stream, credit grants), the user's code, and its outputs."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import structlog

from gearbus.api.graph import Application
from gearbus.api.task import TaskContext
from gearbus.chain import failure_report
from gearbus.runtime_tasks import DataSourceTask
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from services.executor.frames import (
    DataPlaneError,
    Frame,
    FrameReader,
    decode_credit,
    encode_credit,
)
from services.executor.outputs import DataPlaneConfig, Outputs
from shared import subjects
from shared.bus import unsubscribe_all
from shared.messages import AppError, TaskCounters, TaskId

log = structlog.get_logger()


class _Input:
    """What a task knows about one upstream sender."""

    __slots__ = ("session", "next_seq", "watermark", "unacked")

    def __init__(self):
        self.session = None
        self.next_seq = 1
        self.watermark = WATERMARK_MIN
        self.unacked = 0


class TaskRunner:
    def __init__(
        self,
        nc,
        app: Application,
        app_id: int,
        task_id: TaskId,
        executor_id: int,
        config: DataPlaneConfig,
        on_done: Callable[[TaskRunner, AppError | None], Awaitable[None]],
        start_ms: int = 0,
        restart: bool = False,
        ended_inputs: frozenset[tuple[int, int]] = frozenset(),
    ):
        graph = app.graph
        self.nc = nc
        self.app_id = app_id
        self.task_id = task_id
        self.processor = graph.processors[task_id.processor]
        self.config = config
        self.on_done = on_done
        self.context = TaskContext(app_id, app.name, self.processor, task_id.index, executor_id, start_ms, restart)
        self.restart = restart
        self.name = self.context.task_name
        self.task = self.processor.task_class(self.context)
        self.inputs = {
            (edge.upstream.id, i): _Input()
            for edge in graph.inputs_of(self.processor)
            for i in range(edge.upstream.parallelism)
        }
        for sender in ended_inputs & self.inputs.keys():  # upstream tasks that ended before a restart
            self.inputs[sender].watermark = WATERMARK_MAX
        self.ended_inputs = ended_inputs & self.inputs.keys()
        session = random.getrandbits(31)
        edges = [(e.partitioner, e.downstream.id, e.downstream.parallelism) for e in graph.outputs_of(self.processor)]
        self.outputs = Outputs(nc, app_id, self.processor.id, task_id.index, session, edges, config)
        self.inbox: asyncio.Queue[bytes | Frame] = asyncio.Queue()
        self.local_senders: dict[tuple[int, int], TaskRunner] = {}
        self.reader = FrameReader()
        self.watermark = WATERMARK_MIN
        self.records_in = 0
        self.frames_in = 0
        self.dropped = 0
        self.frames_lost = 0
        self.finished = False
        self._subs = []

    def counters(self) -> TaskCounters:
        return TaskCounters(
            task=self.task_id,
            records_in=self.records_in,
            records_out=self.outputs.records_out,
            frames_in=self.frames_in,
            frames_out=self.outputs.frames_out,
            watermark=self.watermark,
            finished=self.finished,
            messages_dropped=self.dropped,
            frames_lost=self.frames_lost,
            late_records=getattr(self.task, "late_records", 0),
        )

    def link_local(self, runners: dict[tuple[int, int], TaskRunner]) -> None:
        """Know the tasks in this executor: frames to them and credit from them skip NATS."""
        self.outputs.link_local({key: runner.inbox for key, runner in runners.items()})
        self.local_senders = {key: runner for key, runner in runners.items() if key in self.inputs}

    async def subscribe(self) -> None:
        """Open the inbox and the credit subject; called before any task starts."""
        index, processor = self.task_id.index, self.processor.id

        async def on_data(msg):
            self.inbox.put_nowait(msg.data)

        async def on_credit(msg):
            try:
                receiver_processor, receiver_index, frames, reset = decode_credit(msg.data)
            except DataPlaneError as exc:
                log.warning("credit_dropped", task=self.name, error=str(exc))
                return
            self.outputs.grant(receiver_processor, receiver_index, frames, reset)

        limit = dict(pending_msgs_limit=-1, pending_bytes_limit=-1)
        self._subs.append(await self.nc.subscribe(subjects.task_inbox(self.app_id, processor, index), cb=on_data, **limit))
        self._subs.append(await self.nc.subscribe(subjects.task_credit(self.app_id, processor, index), cb=on_credit, **limit))

    async def run(self) -> None:
        """Run the task to its end; report success or the user's error through on_done."""
        structlog.contextvars.bind_contextvars(task_id=self.name)  # this asyncio task's context only
        error = None
        started = False
        try:
            self.task.on_start()
            started = True
            if self.restart:
                await self._reset_senders()
            if isinstance(self.task, DataSourceTask):
                await self._run_source()
                await self._advance(WATERMARK_MAX)  # the input ended: every window completes
            else:
                await self._run_stream()  # ends with the final watermark from every input
            self.task.on_end()
            await self._flush()
            await self.outputs.finish(WATERMARK_MAX)
            self.finished = True
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = failure_report(exc, self.context)
            log.error("task_failed", task=self.name, error=f"{error.error_type}: {error.message}")
        finally:
            if started:
                try:
                    self.task.on_stop()
                except Exception as exc:
                    log.warning("task_on_stop_failed", task=self.name, error=repr(exc))
        await self.on_done(self, error)

    async def close(self) -> None:
        await unsubscribe_all(self._subs)

    # --- sources ---------------------------------------------------------------

    async def _run_source(self) -> None:
        task, batch = self.task, self.config.batch_records
        while True:
            count = task.read(batch)
            if count is None:
                return
            if not count:
                await asyncio.sleep(task.source.idle_wait_s())
                continue
            self.records_in += count
            await self._advance(task.watermark)
            await self._flush()
            await asyncio.sleep(0)  # let the executor's other tasks run between batches

    # --- everything else -------------------------------------------------------

    async def _reset_senders(self) -> None:
        """A restarted task tells each live upstream task to start over with full credit
        (what it had in flight to the lost task is gone: at-most-once)."""
        window = self.config.credit_frames
        for sender in self.inputs.keys() - self.ended_inputs:
            local = self.local_senders.get(sender)
            if local is not None:
                local.outputs.grant(self.processor.id, self.task_id.index, window, reset=True)
            else:
                await self.nc.publish(subjects.task_credit(self.app_id, *sender),
                                      encode_credit(self.processor.id, self.task_id.index, window, reset=True))

    async def _run_stream(self) -> None:
        await self._advance(min(s.watermark for s in self.inputs.values()))  # inputs that ended before a restart
        open_inputs = len(self.inputs) - len(self.ended_inputs)
        inbox, task = self.inbox, self.task
        linger = self.config.linger_ms / 1000
        batch = self.config.batch_records
        while open_inputs:
            if inbox.empty():
                if task.output:
                    if linger:
                        try:
                            data = await asyncio.wait_for(inbox.get(), linger)
                        except asyncio.TimeoutError:
                            await self._flush()
                            data = await inbox.get()
                    else:
                        await self._flush()
                        data = await inbox.get()
                else:
                    data = await inbox.get()
            else:
                data = inbox.get_nowait()
            if await self._accept(data):
                open_inputs -= 1
            if len(task.output) >= batch:
                await self._flush()

    async def _accept(self, data: bytes | Frame) -> bool:
        """Process one inbox message; return True when it ended an input."""
        if type(data) is Frame:
            sender, frame = (data.src_processor, data.src_index), data
        else:
            try:
                sender, frame = self.reader.feed(data)
            except DataPlaneError as exc:
                return self._drop(str(exc))
        state = self.inputs.get(sender)
        if state is None:
            return self._drop(f"data from {sender}, which is not an input of this task")
        await self._consumed(sender, state)
        if frame is None:
            return False
        if frame.session != state.session:
            # First contact, or the sender was restarted, or we were: sequence numbers
            # start from this frame (loss is detected within a session).
            if state.session is not None:
                log.warning("sender_new_session", task=self.name, sender=sender)
            state.session, state.next_seq = frame.session, frame.seq
        if frame.seq != state.next_seq:
            await self._lost(sender, state, frame.seq)
        state.next_seq = frame.seq + 1
        self.frames_in += 1
        records = frame.records
        if records:
            self.records_in += len(records)
            self.task.current_time = records[-1].timestamp
            self.task.on_batch(records)
        if frame.watermark != state.watermark:
            state.watermark = frame.watermark
            await self._advance(min(s.watermark for s in self.inputs.values()))
        return frame.eos

    async def _lost(self, sender: tuple[int, int], state: _Input, seq: int) -> None:
        """Frames went missing (e.g. while a NATS server failed over): count them, give
        their credit back so the sender does not starve, and go on (at-most-once; with
        checkpoints this becomes a recovery)."""
        missing = seq - state.next_seq
        if missing < 0:
            raise DataPlaneError(f"{self.name}: frame {seq} from {sender} arrived after {state.next_seq - 1}: "
                                 "frames out of order")
        self.frames_lost += missing
        log.warning("frames_lost", task=self.name, sender=sender, frames=missing, guarantee="at-most-once")
        state.unacked += missing - 1  # the arriving frame itself is counted by _consumed
        await self._consumed(sender, state)

    def _drop(self, reason: str) -> bool:
        """Log and count a message that is not a frame from one of our senders: it is
        not our data (a real sender's loss shows up as a sequence gap instead)."""
        self.dropped += 1
        log.warning("data_message_dropped", task=self.name, error=reason)
        return False

    async def _consumed(self, sender: tuple[int, int], state: _Input) -> None:
        """Grant credit back in batches of half the window."""
        state.unacked += 1
        if state.unacked * 2 >= self.config.credit_frames:
            frames, state.unacked = state.unacked, 0
            local = self.local_senders.get(sender)
            if local is not None:
                local.outputs.grant(self.processor.id, self.task_id.index, frames)
                return
            grant = encode_credit(self.processor.id, self.task_id.index, frames)
            await self.nc.publish(subjects.task_credit(self.app_id, sender[0], sender[1]), grant)

    async def _advance(self, watermark: int) -> None:
        """Move the task's watermark forward. The task sees it first (windows it
        completes fire), then everything emitted so far goes out carrying it, so results
        precede the watermark downstream, as in Flink."""
        if watermark <= self.watermark:
            return
        self.watermark = watermark
        self.task.on_watermark(watermark)
        if watermark < WATERMARK_MAX:  # the final watermark goes out after on_end's output
            await self._flush()

    async def _flush(self) -> None:
        """Send what the task emitted, with the task's watermark (which holds after it)."""
        self.task.output, output = [], self.task.output
        await self.outputs.send(output, self.watermark)
