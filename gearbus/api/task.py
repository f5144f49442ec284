"""What user code implements: Tasks that receive records and emit downstream, and the
DataSource / DataSink interfaces behind source and sink processors (Gearpump's)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple


class NotRescalable(ValueError):
    """A step's state cannot be split over another number of tasks (it is not grouped
    by key, and its class does not say how to divide it)."""


def not_rescalable(states: list, what: str) -> None:
    """None when no old task held state (there is nothing to divide); else NotRescalable
    naming ``what``."""
    if any(state is not None for state in states):
        raise NotRescalable(f"{what} holds state that is not grouped by key, so it cannot be divided "
                            "over another number of tasks")


class Record(NamedTuple):
    """One record: a value, its event time (epoch ms) and an optional key.

    On the wire a record is the msgpack array ``[value, timestamp, key]``.
    """

    value: Any
    timestamp: int
    key: Any = None


#: ``new_record(Record, (value, timestamp, key))`` builds a Record at C speed; the
#: NamedTuple constructor is a Python function, which costs twice as much per record.
new_record = tuple.__new__


def now_ms() -> int:
    """Ingestion time: the wall clock in epoch milliseconds."""
    return int(time.time() * 1000)


def _nothing() -> None:
    pass


class TaskContext:
    """What a task knows about where it runs."""

    def __init__(self, app_id: int, app_name: str, processor, index: int, executor_id: int,
                 app_start_ms: int = 0, epoch: int = 0,
                 nats_servers: list[str] | None = None, clock: Callable[[], int] = now_ms,
                 request_poll: Callable[[], None] = _nothing, state_backend: str = "memory",
                 state_dir: str | None = None, local_copies: bool = True, app_security=None, worker: str = ""):
        """``clock`` and ``request_poll`` come from the driver running the task (see
        :meth:`now_ms` and :attr:`request_poll`)."""
        self.app_id = app_id
        #: The attempt of the whole application this task was opened in: 0 at the start, n after
        #: the n-th rollback to a checkpoint (or change). Frames and writes carry it; older ones
        #: are dropped. A task that goes on in place through a rescale of other processors
        #: keeps the epoch it opened in here; its frames carry the app's current one.
        self.epoch = epoch
        #: The cluster's NATS URLs (empty in the TestRunner): connectors use them by default.
        self.nats_servers: list[str] = list(nats_servers or [])
        #: When the application started (epoch ms; 0 when unknown): a source that follows the
        #: clock uses it to resume at the right place after a restart.
        self.app_start_ms = app_start_ms
        self.app_name = app_name
        self.processor = processor
        self.processor_id: int = processor.id
        self.processor_name: str = processor.name
        self.index = index
        self.parallelism: int = processor.parallelism
        self.config: dict = processor.config
        self.executor_id = executor_id
        #: Where the task's keyed state lives (a name in gearbus.runtime.state_backend.BACKENDS),
        #: and the directory a disk backend keeps its files under (None: a temporary one).
        self.state_backend = state_backend
        self.state_dir = state_dir
        #: whether state on disk is kept as local copies to restore from (gearbus/runtime/local_copies.py)
        self.local_copies = local_copies
        #: The app's own NATS credential and TLS files (a shared.security.Security; None off a
        #: cluster): for what the app itself owns, its intermediate streams; never a user's streams.
        self.app_security = app_security
        #: Where the task runs, for the errors a user reads: its worker's id and host ("" off a cluster).
        self.worker = worker
        self._clock = clock
        #: Tells the driver that results came in without input (an async call finished): it
        #: calls :meth:`Task.poll` soon. Call it on the task's event loop.
        self.request_poll = request_poll

    @property
    def task_name(self) -> str:
        return f"{self.processor_name}[{self.index}]"

    def now_ms(self) -> int:
        """Processing time in epoch ms: the wall clock on a cluster; in the TestRunner the
        engine's own clock, so processing-time timers fire at the same points every run."""
        return self._clock()


class Task:
    """A task of a processor. Override :meth:`on_next` (one record) or, for speed,
    :meth:`on_batch` (every record of one input frame); emit with :meth:`emit`.

    :meth:`on_end` runs once every input has ended: a bounded task emits its final
    results there. An exception from any of these is a user error: the app restores its
    last checkpoint once, and fails if the same exception comes again; its type, message
    and the line of your code that raised reach ``gearbus status``.
    """

    def __init__(self, context: TaskContext):
        self.context = context
        self.output: list[Record] = []
        self.current_time: int = 0

    def on_start(self) -> None:
        """Called once before the first record."""

    def on_next(self, record: Record) -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement on_next or on_batch")

    def on_batch(self, records: list[Record]) -> None:
        for record in records:
            self.current_time = record.timestamp
            self.on_next(record)

    def on_watermark(self, watermark: int) -> None:
        """Called when the task's input watermark advances (after the records that came
        before it); event-time operators fire their complete windows here."""

    def on_end(self) -> None:
        """Called once when every input has ended (after the final watermark), before
        end-of-stream goes downstream."""

    def on_stop(self) -> None:
        """Called when the task stops, whether it ended, failed or was killed."""

    def snapshot(self) -> Any:
        """The task's state at a checkpoint barrier (any picklable value; None when it
        holds none). Everything the task needs to resume exactly must be in it."""
        return None

    def restore(self, state: Any) -> None:
        """Resume from what :meth:`snapshot` returned; called after :meth:`on_start`,
        before the first record, when the application recovers from a checkpoint."""

    def state_size(self) -> tuple[int, int]:
        """(keyed entries, bytes) of the state the task holds now, for its metrics
        (``gearbus_state_keys`` / ``gearbus_state_bytes``); called about once a second,
        so estimate rather than measure a large state."""
        return 0, 0

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        """Called at a checkpoint barrier just before :meth:`snapshot`: a task that writes
        out seals what it wrote since the previous barrier (a sink's pre-commit)."""

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Called once checkpoint ``checkpoint_id`` is complete everywhere: a task that
        writes out commits what it sealed up to it. Runs off the event loop (it may block)
        while the task goes on with later records."""

    # --- processing time: wakeups without input ------------------------------------------

    def next_wakeup_ms(self) -> int | None:
        """The earliest processing time (epoch ms, see :meth:`TaskContext.now_ms`) at which
        the task wants :meth:`on_wakeup` called, input or not; None: never. Asked again
        after every event. Once every input has ended, wakeups are not waited for: the task
        ends without them."""
        return None

    def on_wakeup(self, now_ms: int) -> None:
        """Processing time reached :meth:`next_wakeup_ms` (``now_ms`` is at or past it):
        fire what is due and emit its output."""

    # --- results that come later (async calls) ---------------------------------------

    def poll(self) -> None:
        """Emit the results that came in since the last call (async calls that finished);
        the driver calls it after :attr:`TaskContext.request_poll`. It may raise the error
        of a call that failed, which fails the task."""

    def pending(self) -> bool:
        """Whether results are still to come: the task's end (and its final watermark)
        waits for them."""
        return False

    def full(self) -> bool:
        """Whether the task takes no input now (as many calls in flight as it allows): the
        driver leaves frames unread and uncredited, and a source unread, until a poll made
        room, so credit back-pressures the senders."""
        return False

    def output_watermark(self, watermark: int) -> int:
        """The watermark that holds after everything the task emitted so far, when its
        input's is ``watermark``. A task whose results come later holds it back until the
        results before it are out; by default, the input's."""
        return watermark

    def emit(self, value: Any, key: Any = None, timestamp: int | None = None) -> None:
        """Send a record downstream; its time defaults to that of the latest input record."""
        self.output.append(new_record(Record, (value, self.current_time if timestamp is None else timestamp, key)))

    def emit_keyed(self, pairs: Iterable[tuple[Any, Any]], timestamp: int | None = None) -> None:
        """Send one record per ``(key, value)`` pair, e.g. ``counts.items()``; much
        cheaper than calling :meth:`emit` per pair."""
        ts = self.current_time if timestamp is None else timestamp
        self.output.extend([new_record(Record, (value, ts, key)) for key, value in pairs])


class DataSource:
    """A source of records for a source processor; one instance per task.

    A *replayable* source records its read position in :meth:`snapshot` and goes back to
    it in :meth:`restore`, so a recovery re-reads exactly what followed the checkpoint.
    """

    #: True when snapshot/restore make the source re-read exactly (files, JetStream).
    replayable = False
    #: True when the source stamps each record with an event time of its own (a stream's
    #: timestamps, say) rather than the time it was read: joins in event time need it.
    event_time = False
    #: True when opening it from the submitting machine tells whether it can be read at all
    #: (a NATS stream: yes; a file path, which is a path on the workers: no).
    checked_at_submit = False

    def open(self, context: TaskContext) -> None:
        """Prepare to read this task's share of the input."""

    def read(self, max_records: int) -> list[Record] | None:
        """Return the next records (up to about ``max_records``), ``[]`` when none are
        ready yet, or ``None`` once the input has ended."""
        raise NotImplementedError

    def idle_wait_s(self) -> float:
        """How long to wait before reading again after :meth:`read` returned ``[]``."""
        return 0.01

    def watermark(self) -> int | None:
        """The source's own watermark (e.g. the minimum over its partitions), or None to
        let the task derive it from the timestamps read (``max_out_of_orderness_ms``)."""
        return None

    def snapshot(self) -> Any:
        """The read position (picklable), taken at a checkpoint barrier."""
        return None

    def restore(self, state: Any) -> None:
        """Go back to a position :meth:`snapshot` returned; called after :meth:`open`."""

    def rescale(self, states: list, index: int, parallelism: int) -> Any:
        """The position task ``index`` of ``parallelism`` restores from, when a savepoint
        taken with another parallelism is restored (see :meth:`DataSink.rescale`)."""
        not_rescalable(states, f"source {type(self).__name__}")
        return None

    def prepare_checkpoint(self, checkpoint_id: int) -> None:
        """A checkpoint's barrier: :meth:`snapshot` follows, for ``checkpoint_id``."""

    def checkpoint_complete(self, checkpoint_id: int) -> None:
        """Every task's snapshot of ``checkpoint_id`` is stored: no recovery goes back
        before it, so a source may drop what it had read by then."""

    def close(self) -> None:
        """Release what :meth:`open` acquired."""


class DataSink:
    """A destination of records for a sink processor; one instance per task.

    A *transactional* sink commits in two phases, so its output is exactly-once: what
    :meth:`write` receives between two checkpoint barriers becomes one transaction,
    sealed by :meth:`pre_commit` at the barrier (and kept in :meth:`snapshot`), and made
    visible by :meth:`commit` once the checkpoint is complete. A commit repeated after a
    crash must change nothing (the same ids, the same bytes).
    """

    #: True when writes become visible only through commit (exactly-once).
    transactional = False

    def open(self, context: TaskContext) -> None:
        """Prepare to write this task's records."""

    def write(self, records: list[Record]) -> None:
        raise NotImplementedError

    def pre_commit(self, checkpoint_id: int) -> None:
        """Seal what was written since the previous barrier as the transaction of
        ``checkpoint_id``; called at the barrier, just before :meth:`snapshot`."""

    def commit(self, checkpoint_id: int) -> None:
        """Make every sealed transaction up to ``checkpoint_id`` durable and visible,
        idempotently. May block (it runs off the task's event loop)."""

    def snapshot(self) -> Any:
        """The sink's state at a barrier, with its sealed, uncommitted transactions."""
        return None

    def restore(self, state: Any) -> None:
        """Resume from a completed checkpoint's state; called after :meth:`open`. Its
        sealed transactions belong to a completed checkpoint: commit them (idempotently)
        and discard anything written after it."""

    def rescale(self, states: list, index: int, parallelism: int) -> Any:
        """The state task ``index`` of ``parallelism`` restores from, when a savepoint
        taken with another parallelism is restored: ``states`` are every old task's
        :meth:`snapshot`, in task order. Raises NotRescalable unless no task held any."""
        not_rescalable(states, f"sink {type(self).__name__}")
        return None

    def close(self) -> None:
        """Flush and release; called when the input has ended."""
