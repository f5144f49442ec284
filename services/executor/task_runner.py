"""Runs one task inside an executor: its inbox and credit subjects, the task core (which
keeps the input rules), the user's code, its outputs, and its commits.

A task lives until its application's final checkpoint completes (or it is replaced by
a recovery): after its end-of-stream it still passes barriers on and commits. Besides
frames, the loop waits for the task's async calls (which ask for a poll) and for its
processing-time wakeups (the wait on the inbox ends at the next one); while the task is
full it leaves the inbox unread, so its senders run out of credit. What its
events mean (reports, finishing, failing) the executor's task machine decides
(gearbus/runtime/executor_tasks.py); the runner tells it what happened.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import structlog

from gearbus.api.graph import Application
from gearbus.api.io_tasks import DataSourceTask
from gearbus.api.task import TaskContext, now_ms
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.failures import failure_report
from gearbus.runtime.core import DataPlaneError, End, Grant, Snapshot, TaskCore
from gearbus.runtime.frames import Frame, FrameReader, decode_credit, encode_credit
from gearbus.runtime.keygroups import collector_paused
from gearbus.runtime.sender import edges_of, senders_of
from gearbus.runtime.snapshots import MAX_DEPTH, TaskSnapshot
from gearbus.runtime.source import SourceLoop
from gearbus.control.config import AppConfig
from services.executor.outputs import Outputs
from services.histogram import Histogram
from services.launch import state_directory, worker_place
from shared import subjects
from shared.bus import unsubscribe_all
from shared.messages import AppError, FailureKind, TaskCounters, TaskId

log = structlog.get_logger()

INBOX_SLACK_BYTES = 8 << 20  # beyond what the credit granted allows, before an inbox drops
IDLE_GRANT_S = 0.5  # an idle task repeats its credit grants this often
PROBE_S = 1.0  # a task probes its channels whose last frames are unconfirmed this often


class _Stop:
    """Put in the inbox to end the task's loop."""


class _Poll:
    """Put in the inbox when the task's async calls brought results: the loop polls."""


STOP = _Stop()
POLL = _Poll()


class TaskRunner:
    def __init__(
        self,
        nc,
        app: Application,
        app_id: int,
        task_id: TaskId,
        executor_id: int,
        config: AppConfig,
        on_done: Callable[[TaskRunner, AppError | None, bool], Awaitable[None]],
        on_snapshot: Callable[[TaskRunner, Snapshot, float], Awaitable[None]],
        on_ended: Callable[[TaskRunner], Awaitable[None]],
        start_ms: int = 0,
        epoch: int = 0,
        restore: TaskSnapshot | None = None,
        servers: list[str] | None = None,
        hold_from: int | None = None,
        security=None,
    ):
        """``restore``: the snapshot to resume from (None: a fresh start); ``hold_from``:
        see :class:`gearbus.runtime.core.TaskCore`; ``security``: the app's own (its tasks'
        ``TaskContext.app_security``)."""
        graph = app.graph
        self.nc = nc
        self.app_id = app_id
        self.task_id = task_id
        self.processor = graph.processors[task_id.processor]
        self.config = config
        self.on_done = on_done
        self.on_snapshot = on_snapshot
        self.on_ended = on_ended
        self.epoch = epoch
        self.executor_id = executor_id
        self.restore_envelope = restore
        self.context = TaskContext(app_id, app.name, self.processor, task_id.index, executor_id, start_ms,
                                   epoch=epoch, nats_servers=servers, request_poll=self._request_poll,
                                   state_backend=config.state_backend, state_dir=state_directory(),
                                   local_copies=config.local_copies, app_security=security, worker=worker_place())
        self.name = self.context.task_name
        self.task = self.processor.task_class(self.context)
        senders = senders_of(graph, self.processor)
        self.core = TaskCore(self.task, senders, config.credit_frames, epoch,
                             max_depth=MAX_DEPTH if config.incremental_checkpoints else 0,
                             debloat_target_ms=config.debloat_target_ms, hold_from=hold_from)
        self.outputs = Outputs(nc, app_id, self.processor.id, task_id.index, epoch, edges_of(graph, self.processor),
                               config)
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.inbox_limit = self._inbox_limit(senders)
        self.inbox_bytes = 0
        self.local_senders: dict[tuple[int, int], TaskRunner] = {}
        self.reader = FrameReader()
        self.source = SourceLoop(self.core, config.batch_records) if isinstance(self.task, DataSourceTask) else None
        self.wake = asyncio.Event()  # a barrier asked for, a call's results, the resume, or the stop
        self.resume_due = False  # kept running by a rescale: the loop resumes the parked core
        self.polls_due = False  # the task's calls brought results since the last poll
        self._probe_at = time.monotonic() + PROBE_S
        self.poll_queued = False  # a POLL waits in the inbox
        self._commit_lock = asyncio.Lock()
        self.dropped = 0
        self.bytes_in = 0
        self.batches = Histogram()  # time to process each batch (a frame, or a source's read)
        self._aligning_since: float | None = None  # when the barrier being aligned first arrived (monotonic)
        self.timed = config.task_metrics
        self.stopped = False
        self._subs = []

    def _inbox_limit(self, senders: list) -> int:
        """What credit lets legitimate senders have in flight (twice over): the bound on the inbox."""
        return max(len(senders), 1) * self.config.credit_frames * self.config.batch_bytes * 2 + INBOX_SLACK_BYTES

    def rewire(self, app: Application, epoch: int) -> None:
        """Parked at a rescale's checkpoint, go on in ``epoch`` on the channels of ``app``
        (the plan at the new parallelism), the task and its state as they are; it takes
        input again once resumed (:meth:`resume`)."""
        self.processor = app.graph.processors[self.task_id.processor]
        self.epoch = epoch
        senders = senders_of(app.graph, self.processor)
        self.core.rewire(senders, epoch)
        self.outputs.rewire(epoch, edges_of(app.graph, self.processor))
        self.inbox_limit = self._inbox_limit(senders)
        self.reader = FrameReader()  # fragments of the old epoch are never glued to the new one's
        self.local_senders = {}

    def resume(self) -> None:
        """Take input again (the loop resumes the core, between two of its steps)."""
        self.resume_due = True
        self.inbox.put_nowait(POLL)
        self.wake.set()

    def counters(self, finished: bool) -> TaskCounters:
        """``finished``: its final checkpoint committed."""
        source = getattr(self.task, "source", None)
        try:
            state_keys, state_bytes = self.task.state_size()
        except Exception as exc:  # noqa: BLE001 - a metric never stops the executor; the task meets it itself
            log.warning("state_size_failed", task=self.name, error=repr(exc))
            state_keys = state_bytes = 0
        return TaskCounters(
            task=self.task_id,
            records_in=self.core.records_in if self.source is None else self.source.records_read,
            records_out=self.outputs.sender.records_out,
            frames_in=self.core.frames_in,
            frames_out=self.outputs.sender.frames_out,
            watermark=self.core.watermark,
            latest_event_ms=self.core.latest_event_ms if self.core.latest_event_ms > WATERMARK_MIN else None,
            finished=finished,
            messages_dropped=self.dropped,
            late_records=getattr(self.task, "late_records", 0),
            stale_frames=self.core.stale_frames,
            dead_letters=getattr(source, "dead_letters", 0),
            epoch=self.epoch,
            executor_id=self.executor_id,
            bytes_in=self.bytes_in,
            bytes_out=self.outputs.sender.bytes_out,
            inbox_depth=self.inbox.qsize(),
            backpressure_ms=self.outputs.backpressure_s * 1000,
            busy_ms=self.batches.total_ms,
            batch_ms_buckets=list(self.batches.counts),
            state_keys=state_keys,
            state_bytes=state_bytes,
        )

    def link_local(self, runners: dict[tuple[int, int], TaskRunner]) -> None:
        """Know the tasks in this executor: frames to them and credit from them skip NATS."""
        self.outputs.link_local({key: runner.deliver_local for key, runner in runners.items()})
        self.local_senders = {key: runner for key, runner in runners.items() if key in self.core.inputs}

    def deliver_local(self, frame: Frame, size: int) -> None:
        """A frame from a task in this executor (``size``: its encoded bytes)."""
        self.bytes_in += size
        self.inbox.put_nowait(frame)

    async def subscribe(self) -> None:
        """Open the inbox and the credit subject; called before any task starts."""
        index, processor = self.task_id.index, self.processor.id

        async def on_data(msg):
            if self.inbox_bytes >= self.inbox_limit:  # only a sender ignoring credit gets here
                self._drop("inbox full: a sender is not respecting its credit")
                return
            self.inbox_bytes += len(msg.data)
            self.bytes_in += len(msg.data)
            self.inbox.put_nowait(msg.data)

        async def on_credit(msg):
            try:
                receiver_processor, receiver_index, epoch, frames, window = decode_credit(msg.data)
            except DataPlaneError as exc:
                self._drop(str(exc))
                return
            if not self.outputs.grant(receiver_processor, receiver_index, epoch, frames, window):
                self.dropped += 1

        limit = dict(pending_msgs_limit=-1, pending_bytes_limit=-1)
        self._subs.append(await self.nc.subscribe(subjects.task_inbox(self.app_id, processor, index), cb=on_data, **limit))
        self._subs.append(await self.nc.subscribe(subjects.task_credit(self.app_id, processor, index), cb=on_credit, **limit))

    async def _restore(self) -> None:
        """Restore the task from its envelope, off the loop (a sink re-commits: it may
        block), then let the envelope go: its chain's bytes are not kept past the restore
        (but for a rescale's new task, whose keyed steps keep their share of the old tasks'
        until a snapshot of theirs completes: see KeyedOp.snapshot_since). Logged with its
        time: most of a recovery's, with millions of keys."""
        envelope, self.restore_envelope = self.restore_envelope, None
        started = time.monotonic()

        def restore() -> None:
            with collector_paused():
                self.core.restore(envelope)
        await asyncio.to_thread(restore)
        backend = getattr(self.task, "state_backend", None)
        log.info("task_restored", checkpoint_id=envelope.checkpoint_id, seconds=round(time.monotonic() - started, 3),
                 groups_from_local_copies=getattr(backend, "adopted", None) or None)

    async def run(self) -> None:
        """Run the task until it is stopped (its final checkpoint committed, or it is
        retired) or fails; then tell ``on_done``."""
        structlog.contextvars.bind_contextvars(task_id=self.name, epoch=self.epoch)
        error, recoverable, started = None, False, False
        try:
            self.task.on_start()
            started = True
            if self.restore_envelope is not None:
                await self._restore()
                if self.core.ended:  # it had ended before the checkpoint: its receivers hear the end again
                    await self.outputs.publish(self.outputs.sender.finish(WATERMARK_MAX))
                    await self.on_ended(self)
            if self.source is not None and not self.core.ended:
                await self._run_source()
            await self._run_stream()
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            error = failure_report(exc, self.context)
            recoverable = error.kind == FailureKind.FAULT
            log.error("task_failed", task=self.name, error=f"{error.error_type}: {error.message}", kind=error.kind,
                      step=error.step, location=error.location, exc_info=exc)
        finally:
            if started:
                try:
                    self.task.on_stop()
                except Exception as exc:
                    log.warning("task_on_stop_failed", task=self.name, error=repr(exc))
        await self.on_done(self, error, recoverable)

    async def stop(self) -> None:
        """Leave the loop (finished, failed, replaced by a recovery, or the executor stops)."""
        self.stopped = True
        self.inbox.put_nowait(STOP)
        self.wake.set()

    async def close(self) -> None:
        await unsubscribe_all(self._subs)
        self._subs = []

    # --- checkpoints -----------------------------------------------------------------

    def inject(self, checkpoint_id: int, park: bool = False) -> None:
        """A source task: inject the barrier of ``checkpoint_id`` between two batches
        (``park``: then every task parks after its snapshot)."""
        self.source.inject(checkpoint_id, park)
        self.wake.set()
        if self.core.input_ended:  # an ended source waits on its inbox, a reading one on ``wake``
            self.inbox.put_nowait(checkpoint_id)

    async def commit(self, checkpoint_id: int) -> None:
        """Commit what was sealed up to ``checkpoint_id`` (off the loop, one commit at a
        time, in the order asked); later snapshots build on its."""
        self.core.completed(checkpoint_id)
        async with self._commit_lock:
            await asyncio.to_thread(self.task.checkpoint_complete, checkpoint_id)

    # --- sources ---------------------------------------------------------------------

    async def _run_source(self) -> None:
        source = self.source
        while not self.stopped:
            await self._due()
            count = await self._source_step()
            if count is None:
                return
            if count:
                await asyncio.sleep(0)  # let the executor's other tasks run between batches
            elif not source.barriers:  # nothing to read now, or the task is full or parked
                await self._wait_for_wake(None if self.core.parked else self.task.source.idle_wait_s())

    async def _source_step(self) -> int | None:
        """One step of the source loop, carried out; the records it read (None: the source
        ended). Its actions, and so the batch's records, die on return: kept alive through
        the next read they would be scanned by every full garbage collection there, which
        costs a heavy shuffle several percent of its throughput."""
        started = time.perf_counter() if self.timed else 0.0
        actions, count = self.source.step()
        if count and self.timed:
            self.batches.observe((time.perf_counter() - started) * 1000)
        await self._act(actions)
        return count

    # --- everything else -------------------------------------------------------------

    async def _run_stream(self) -> None:
        """Frames until the task is finished or stopped (after its end, only barriers come)."""
        inbox, task = self.inbox, self.task
        linger = self.config.linger_ms / 1000
        batch = self.config.batch_records
        if self.source is not None:  # barriers asked for while the source read its last batch
            await self._act(self.source.pending_barriers())
        while True:
            await self._due()
            if not self.core.accepting:  # full: frames stay in the inbox, uncredited
                if self.stopped:
                    return
                if self.source is not None:  # an ended source still passes barriers on
                    await self._act(self.source.pending_barriers())
                await self._wait_for_wake(None)
                continue
            if inbox.empty():
                if task.output:
                    if linger:
                        try:
                            data = await asyncio.wait_for(inbox.get(), linger)
                        except asyncio.TimeoutError:
                            await self._flush()
                            data = await self._next_while_idle()
                    else:
                        await self._flush()
                        data = await self._next_while_idle()
                else:
                    data = await self._next_while_idle()
            else:
                data = inbox.get_nowait()
            if data is STOP:
                return
            if data is POLL:
                self.poll_queued = False
                continue
            if type(data) is int:  # a barrier injected at an ended source
                await self._act(self.source.pending_barriers())
                continue
            await self._accept(data)
            if len(task.output) >= batch:
                await self._flush()

    async def _next_while_idle(self) -> bytes | Frame | int | object:
        """The next inbox item; while none comes, due wakeups fire and the credit grants are
        repeated now and then, so a grant lost with a NATS server cannot leave a sender
        waiting forever."""
        loop = asyncio.get_running_loop()
        grants_at = loop.time() + IDLE_GRANT_S
        while True:
            try:
                return await asyncio.wait_for(self.inbox.get(), self._until_wakeup(grants_at - loop.time()))
            except asyncio.TimeoutError:
                pass
            await self._due()
            if loop.time() >= grants_at and not self.core.parked:
                grants_at = loop.time() + IDLE_GRANT_S
                await self._act(self.core.repeat_grants())

    # --- results of async calls, and processing-time wakeups ------------------------------

    def _request_poll(self) -> None:
        """The task's calls brought results: wake the loop, whichever wait it is in."""
        self.polls_due = True
        self.wake.set()
        if not self.poll_queued:
            self.poll_queued = True
            self.inbox.put_nowait(POLL)

    async def _due(self) -> None:
        """Resume if asked, take in the results that came, fire a wakeup that is due, and
        now and then probe the channels whose last frames are unconfirmed (see
        :meth:`Sender.probes`)."""
        if self.resume_due:
            self.resume_due, self.polls_due = False, True  # results that came while parked
            await self._act(self.core.resume())
        if self.core.parked:  # it sends nothing: the loop only ever waits, so a rewire never cuts a send short
            return
        if (now_s := time.monotonic()) >= self._probe_at:
            self._probe_at = now_s + PROBE_S
            await self.outputs.publish(self.outputs.sender.probes())
        if self.polls_due:
            self.polls_due = False
            await self._act(self.core.poll())
        due = self.core.next_wakeup_ms()
        if due is not None and due <= (now := now_ms()):
            await self._act(self.core.wakeup(now))

    def _until_wakeup(self, limit: float | None) -> float | None:
        """Seconds to wait at most: ``limit`` (None: no limit), or less to the next wakeup."""
        due = self.core.next_wakeup_ms()
        if due is None:
            return None if limit is None else max(limit, 0)
        wait = max(due - now_ms(), 0) / 1000
        return wait if limit is None else max(min(wait, limit), 0)

    async def _wait_for_wake(self, limit: float | None) -> None:
        """Wait for ``wake`` (results, a barrier, the stop), at most ``limit`` seconds or to
        the next wakeup."""
        self.wake.clear()
        if self.polls_due or self.stopped:
            return
        try:
            await asyncio.wait_for(self.wake.wait(), self._until_wakeup(limit))
        except asyncio.TimeoutError:
            pass

    async def _accept(self, data: bytes | Frame) -> None:
        if type(data) is Frame:
            sender, frame = (data.src_processor, data.src_index), data
        else:
            self.inbox_bytes -= len(data)
            try:
                sender, frame = self.reader.feed(data)
            except DataPlaneError as exc:
                self._drop(str(exc))
                return
            if frame is None:
                return
        if sender not in self.core.inputs:
            self._drop(f"data from {sender}, which is not an input of this task")
            return
        started = time.perf_counter()
        actions = self.core.receive(sender, frame)
        took = time.perf_counter() - started
        if not any(type(action) is Snapshot for action in actions):
            self.core.measured(took)
        if self.timed:
            self.batches.observe(took * 1000)
        await self._act(actions)
        if self.core.aligning and self._aligning_since is None:  # a first barrier: its channel is held
            self._aligning_since = time.monotonic()

    async def _act(self, actions: list) -> None:
        for action in actions:
            kind = type(action)
            if kind is Grant:
                await self._grant(*action)
                continue
            await self.outputs.publish(self.outputs.sender.act(action))
            if kind is End:
                await self.on_ended(self)
            elif kind is Snapshot:
                since, self._aligning_since = self._aligning_since, None
                await self.on_snapshot(self, action, time.monotonic() - since if since is not None else 0.0)

    async def _grant(self, sender: tuple[int, int], consumed: int, window: int) -> None:
        local = self.local_senders.get(sender)
        if local is not None:
            local.outputs.grant(self.processor.id, self.task_id.index, self.epoch, consumed, window)
            return
        await self.nc.publish(subjects.task_credit(self.app_id, *sender),
                              encode_credit(self.processor.id, self.task_id.index, self.epoch, consumed, window))

    def _drop(self, reason: str) -> None:
        """Log and count a message that is not a frame from one of our senders."""
        self.dropped += 1
        log.warning("data_message_dropped", task=self.name, error=reason)

    async def _flush(self) -> None:
        """Send what the task emitted, followed by its watermark."""
        await self.outputs.publish(self.outputs.sender.act(self.core.flush()))
