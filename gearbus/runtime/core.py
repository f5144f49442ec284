"""The task core: one task's input rules, free of I/O, driven by both the executor
(frames from NATS and from tasks in the same process) and the TestRunner's engine.

Events in — a frame from a sender, a barrier injected at a source, the end of a
source, results that came in later (async calls), a processing-time wakeup, a
restore — and actions out: grant credit, flush output with a watermark,
take a snapshot (and pass the barrier on), end the stream. An action that sends carries
the output produced up to the moment it was decided: one event may release frames held
behind a barrier, and their output must follow the barrier, not precede it. The core calls the task's
own methods (``on_batch``, ``on_watermark``, ``on_end``, ``snapshot``, ``restore``);
the driver does everything that touches the network, files or other tasks.

The rules, in one place:
- Frames of one sender arrive in order: a gap in sequence numbers means frames were
  lost, which only a recovery can repair (:class:`DataPlaneError`).
- Frames carry the epoch of the sender's attempt; a frame of another epoch comes from
  a replaced (zombie) task or reaches one, and is dropped unread and uncredited.
- Within a frame: records first, then the watermark (which holds after them), then a
  checkpoint barrier, then end-of-stream.
- A task's watermark is the minimum over its inputs'; an ended input counts as +inf.
- Barriers are aligned: a channel whose barrier arrived is held (its frames are kept,
  uncredited, so the credit window bounds them) until every input's barrier arrived;
  then the task snapshots, the barrier goes downstream, and the held frames are
  processed in order.
- A barrier may ask the tasks to park after their snapshot (a change's checkpoint: a
  rescale): a parked task takes no input (every frame is held, uncredited), reads no
  source, fires no wakeup and polls no results, so it stays where the checkpoint cut it.
  It goes on in place once its channels are rewired for the next epoch
  (:meth:`TaskCore.rewire`, then :meth:`TaskCore.resume`): its state is never restored.
- A task that ended (every input delivered end-of-stream) keeps answering barriers, so
  the checkpoint after the end holds every task's final state (Flink's FLIP-147).
- A task whose results come later (``Task.pending``) holds its output watermark back
  (``Task.output_watermark``) until they are out: output is always followed by the
  watermark that holds after it. Its end, and the final watermark, follow its last
  result (:meth:`TaskCore.poll`). A full task (``Task.full``) takes no input: the driver
  leaves its frames unread and uncredited. Barriers do not wait for results: the task's
  snapshot holds what is still to come.
- Processing-time wakeups (``Task.next_wakeup_ms``) fire until every input has ended;
  those still pending then are not waited for.
- The credit window a task grants is debloated (Flink's buffer debloating): from what its
  driver measured it takes to process its frames (:meth:`TaskCore.measured`), it becomes
  what the task gets through in ``debloat_target_ms`` over all its inputs (at least
  MIN_WINDOW frames, at most ``credit_frames``). A barrier waits behind what is in flight
  to it: a slow task (state on disk) with a fixed window of frames queued seconds of
  records before every barrier, and its checkpoints took that long.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

from gearbus.api.task import Record, Task
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.runtime.snapshots import MAX_DEPTH, Lineage, TaskSnapshot
from gearbus.runtime.task_key import TaskKey

NO_BARRIER = 0
#: The smallest credit window a debloated receiver grants: one frame to process while the next comes.
MIN_WINDOW = 2
#: Frames processed between two measures of how long they take (:meth:`TaskCore.measured`).
DEBLOAT_FRAMES = 16


class DataPlaneError(RuntimeError):
    """A frame was malformed, lost or out of order: the stream cannot go on exactly."""


class Frame(NamedTuple):
    """The unit one task sends another (see gearbus/runtime/frames.py for the wire form)."""

    src_processor: int
    src_index: int
    epoch: int
    seq: int
    watermark: int
    eos: bool
    barrier: int  # a checkpoint id, or NO_BARRIER
    records: list[Record]
    park: bool = False  # with a barrier: its receivers park after their snapshot


class Grant(NamedTuple):
    """Tell ``sender`` that ``consumed`` of its frames (this epoch) were processed: it may
    send up to sequence ``consumed`` + ``window``. A count, not an increment, so a grant
    that is lost, repeated or overtaken changes nothing once a later one arrives."""

    sender: TaskKey
    consumed: int
    window: int


class Flush(NamedTuple):
    """Send ``records`` (the task's output up to this point), followed by ``watermark``."""

    records: list[Record]
    watermark: int


class Snapshot(NamedTuple):
    """The task snapshotted for ``checkpoint_id``: send ``records`` (its output before the
    barrier) and ``watermark``, pass the barrier to every receiver, store ``state`` and
    acknowledge. ``ended``: taken after the end."""

    checkpoint_id: int
    state: TaskSnapshot
    ended: bool
    records: list[Record]
    watermark: int
    records_in: int = 0  # what the task processed in its epoch before the barrier
    park: bool = False  # the task parked after it (its barrier asks its receivers to)


class End(NamedTuple):
    """Every input ended and ``on_end`` ran: send ``records``, then end-of-stream."""

    records: list[Record]


class _Input:
    """What a task knows about one upstream sender."""

    __slots__ = ("next_seq", "watermark", "ended", "held", "consumed", "granted", "limit")

    def __init__(self, limit: int):
        self.next_seq = 1
        self.watermark = WATERMARK_MIN
        self.ended = False
        self.held: list[Frame] | None = None  # frames after a barrier, while aligning
        self.consumed = 0  # frames processed (held ones once they are)
        self.granted = 0  # the count last granted
        self.limit = limit  # the highest sequence number granted the sender (credit_frames before any grant)


class TaskCore:
    """One task's inputs, watermark, alignment and snapshots. Methods return actions."""

    def __init__(self, task: Task, senders: Iterable[TaskKey], credit_frames: int, epoch: int = 0,
                 max_depth: int = MAX_DEPTH, debloat_target_ms: float = 0, hold_from: int | None = None):
        """``max_depth``: how many snapshots may build on a whole one (0: every one whole);
        ``debloat_target_ms``: see :meth:`measured` (0: the window stays ``credit_frames``);
        ``hold_from``: an event time from which input records wait for a replacement's new
        code (``gearbus replace --at``): held, in every snapshot, and the task sees the
        watermark only up to the one before; processed by this code should the input end."""
        self.task = task
        self.epoch = epoch
        self.credit_frames = credit_frames
        self.window = credit_frames  # the credit window granted now
        self.debloat_target_s = debloat_target_ms / 1000
        self._measuring = (0, 0, 0.0)  # frames and records in, seconds they took, since the last measure
        self.inputs: dict[TaskKey, _Input] = {s: _Input(credit_frames) for s in senders}
        self.open_inputs = len(self.inputs)
        self.watermark = WATERMARK_MIN  # the input's; the output's may lag (see output_watermark)
        self.hold_from = hold_from
        self.held: list[Record] = []
        #: the newest event time of the last record of each batch it processed (this attempt):
        #: how far a replacement at an event time is too late to give the rest to the new code
        #: (a record out of order inside a batch is not seen: a max per record costs ~65 ns)
        self.latest_event_ms = WATERMARK_MIN
        self._seen = WATERMARK_MIN  # the watermark the task saw (below hold_from while holding)
        self.input_ended = False  # every input ended: the end follows once nothing is pending
        self.ended = False
        self.aligning = NO_BARRIER  # the checkpoint whose barriers are arriving
        self.arrived = 0
        self.parked = False  # since a parking barrier's snapshot, until resume()
        self.last_checkpoint = NO_BARRIER
        self.lineage = Lineage(max_depth)
        self.records_in = 0
        self.frames_in = 0
        self.stale_frames = 0

    # --- events ----------------------------------------------------------------------

    def receive(self, sender: TaskKey, frame: Frame) -> list:
        """A frame from ``sender`` (raises DataPlaneError when frames were lost)."""
        state = self.inputs.get(sender)
        if state is None:
            raise KeyError(sender)
        if frame.epoch != self.epoch:
            self.stale_frames += 1
            return []
        if frame.seq != state.next_seq:
            raise DataPlaneError(
                f"{self.task.context.task_name}: frame {frame.seq} from task {sender} arrived where "
                f"{state.next_seq} was due: {'frames were lost' if frame.seq > state.next_seq else 'out of order'}")
        state.next_seq += 1
        if state.held is not None:
            state.held.append(frame)
            return []
        actions: list = []
        self._process(sender, state, frame, actions)
        return actions

    def inject_barrier(self, checkpoint_id: int, park: bool = False) -> list:
        """A source task's turn: the AppMaster asked for checkpoint ``checkpoint_id``
        (``park``: the task parks after its snapshot)."""
        if checkpoint_id <= self.last_checkpoint:
            return []
        return [self._snapshot(checkpoint_id, park)]

    def rewire(self, senders: Iterable[TaskKey], epoch: int) -> None:
        """A parked task goes on in ``epoch`` with these senders (another processor was
        rescaled): every channel starts anew, held until :meth:`resume`; its state,
        watermark and snapshot lineage stay. Only a parked task can be rewired: nothing
        after the checkpoint it parked at reached it, so no input is lost."""
        if not self.parked:
            raise DataPlaneError(f"{self.task.context.task_name}: rewired while not parked at a checkpoint")
        self.epoch = epoch
        self.inputs = {s: _Input(self.credit_frames) for s in senders}
        for state in self.inputs.values():
            state.held = []
        self.open_inputs = len(self.inputs)
        self.aligning, self.arrived = NO_BARRIER, 0

    def resume(self) -> list:
        """A parked task goes on: what came meanwhile (of its rewired epoch) first; then its
        new receivers hear its end again (it had ended), or its watermark."""
        ended, self.parked = self.ended, False
        actions: list = []
        self._release_held(actions)
        if ended:
            actions.append(End([]))
        elif not self.ended:  # (one the held frames ended has sent its end)
            actions.append(self.flush())
        return actions

    def advance_source(self, watermark: int) -> list:
        """A source task's watermark moved (after the batch it just read)."""
        actions: list = []
        self._advance(watermark, actions)
        return actions

    def end_source(self) -> list:
        """A source task's input ended: every window completes, then end-of-stream."""
        actions: list = []
        self._advance(WATERMARK_MAX, actions)
        self._end(actions)
        return actions

    def flush(self) -> Flush:
        """The task's output so far, to go out followed by its current watermark (the
        driver's batch limit or linger decides when)."""
        return Flush(self._take_output(), self.output_watermark)

    def poll(self) -> list:
        """Results came in without input (the task asked through ``request_poll``): they go
        out with the watermark they release; so does the end, once every input ended and
        no result is still to come. Raises the error of a call that failed."""
        if self.ended or self.parked:
            return []
        self.task.poll()
        if self.input_ended and not self.task.pending():
            actions: list = []
            self._finish(actions)
            return actions
        return [self.flush()]

    def wakeup(self, now_ms: int) -> list:
        """Processing time reached the task's wakeup: what it emits goes out."""
        if self.input_ended or self.parked:
            return []
        self.task.on_wakeup(now_ms)
        return [self.flush()]

    def next_wakeup_ms(self) -> int | None:
        """When the task wants :meth:`wakeup` (epoch ms); None: never, and never once every
        input ended (pending wakeups are not waited for), nor while parked."""
        return None if self.input_ended or self.parked else self.task.next_wakeup_ms()

    @property
    def accepting(self) -> bool:
        """Whether the task takes input now; a full one waits for its results to make room."""
        return not self.task.full()

    @property
    def pending(self) -> bool:
        """Whether results are still to come (the driver waits for them)."""
        return not self.ended and self.task.pending()

    @property
    def output_watermark(self) -> int:
        """The watermark that holds after the task's output so far."""
        return self.task.output_watermark(self._seen)

    def repeat_grants(self) -> list:
        """The current count to every open input, for a driver whose inbox is idle: a grant
        lost (with a NATS server, say) would otherwise leave its sender waiting for good.
        Counts are idempotent, so repeating them never lets a sender past the window."""
        actions: list = []
        for sender, state in self.inputs.items():
            if not state.ended:
                actions.append(self._grant(sender, state))
        return actions

    def measured(self, seconds: float) -> None:
        """The driver timed the last frame's processing (``seconds``, on its own clock; not
        a frame whose barrier took a snapshot: a snapshot's time is not the pace of records).
        Every DEBLOAT_FRAMES frames the window becomes what the task processes in the
        debloat target, at that pace, shared by its inputs (:func:`debloated_window`)."""
        if not self.debloat_target_s:
            return
        frames, records, busy = self._measuring
        busy += seconds
        if self.frames_in - frames < DEBLOAT_FRAMES:
            self._measuring = (frames, records, busy)
            return
        self.window = debloated_window(self.records_in - records, self.frames_in - frames, busy,
                                       self.debloat_target_s, self.open_inputs, self.credit_frames)
        self._measuring = (self.frames_in, self.records_in, 0.0)

    def restore(self, snapshot: TaskSnapshot) -> None:
        """Resume from a snapshot (see :meth:`_snapshot`) holding the whole state."""
        if snapshot.state is not None:  # None: a savepoint held nothing for this task
            if snapshot.copies and (offer := getattr(self.task, "offer_copies", None)) is not None:
                offer(snapshot.copies)
            self.task.restore(snapshot.state)
        self.lineage.restored(snapshot.link)
        self.ended = self.input_ended = snapshot.ended
        self.watermark = self._seen = snapshot.watermark
        self.last_checkpoint = snapshot.checkpoint_id
        if snapshot.held is not None:  # held for this code, or for code that did not come: processed first
            hold_from, held = snapshot.held
            self._seen = min(snapshot.watermark, hold_from - 1)
            self._release(list(held))

    # --- rules -----------------------------------------------------------------------

    def _grant(self, sender: TaskKey, state: _Input) -> Grant:
        """Credit for ``sender`` up to what it processed plus the window. :meth:`_process`
        grants every half window processed (rounded down: one grant lost, the next comes
        before the sender's credit from the one before runs out), and as soon as what the
        sender holds is half the window or less (a window that grew is granted at once,
        not after half of the smaller one went)."""
        state.granted = state.consumed
        state.limit = max(state.limit, state.consumed + self.window)
        return Grant(sender, state.consumed, self.window)

    def _process(self, sender: TaskKey, state: _Input, frame: Frame, actions: list) -> None:
        state.consumed += 1
        window = self.window
        if state.consumed - state.granted >= max(1, window // 2) or (state.limit - state.consumed) * 2 <= window:
            actions.append(self._grant(sender, state))
        self.frames_in += 1
        records = frame.records
        if records and self.hold_from is not None:
            self.held += [r for r in records if r[1] >= self.hold_from]
            records = [r for r in records if r[1] < self.hold_from]
        if records:
            self.records_in += len(records)
            self.task.current_time = last = records[-1][1]
            if last > self.latest_event_ms:
                self.latest_event_ms = last
            self.task.on_batch(records)
        if frame.watermark != state.watermark:
            state.watermark = frame.watermark
            self._advance(min(s.watermark for s in self.inputs.values()), actions)
        if frame.barrier:
            self._barrier(sender, state, frame.barrier, actions, frame.park)
        if frame.eos and not state.ended:
            state.ended = True
            self.open_inputs -= 1
            if not self.open_inputs and not self.ended:
                self._end(actions)

    def _advance(self, watermark: int, actions: list) -> None:
        """The task sees a higher watermark first (complete windows fire), then its output
        goes out followed by it, so results precede the watermark downstream."""
        if watermark <= self.watermark:
            return
        self.watermark = watermark
        seen = watermark if self.hold_from is None else min(watermark, self.hold_from - 1)
        if seen > self._seen:
            self._seen = seen
            self.task.on_watermark(seen)
        if watermark < WATERMARK_MAX:  # the final watermark goes out with end-of-stream
            actions.append(self.flush())

    def _release(self, held: list[Record]) -> None:
        """Process records held for new code that will not come (the input ended), or for
        this new code (restored), then the watermark the task did not see meanwhile."""
        self.hold_from = None
        if held:
            self.records_in += len(held)
            self.task.current_time = held[-1][1]
            self.latest_event_ms = max(self.latest_event_ms, held[-1][1])
            self.task.on_batch(held)
        if self.watermark > self._seen:
            self._seen = self.watermark
            self.task.on_watermark(self.watermark)

    def _end(self, actions: list) -> None:
        """Every input ended; the end waits for results still to come (:meth:`poll`)."""
        if self.hold_from is not None:
            held, self.held = self.held, []
            self.watermark = WATERMARK_MAX
            self._release(held)
        self.watermark = WATERMARK_MAX
        self.input_ended = True
        if self.task.pending():
            actions.append(self.flush())
            return
        self._finish(actions)

    def _finish(self, actions: list) -> None:
        self.task.on_end()
        self.ended = True
        actions.append(End(self._take_output()))

    def _take_output(self) -> list[Record]:
        output, self.task.output = self.task.output, []
        return output

    def _barrier(self, sender: TaskKey, state: _Input, checkpoint_id: int, actions: list, park: bool) -> None:
        if checkpoint_id != self.aligning:
            if self.aligning != NO_BARRIER:
                raise DataPlaneError(
                    f"{self.task.context.task_name}: barrier {checkpoint_id} from task {sender} arrived while "
                    f"barrier {self.aligning} was still aligning")
            self.aligning, self.arrived = checkpoint_id, 0
        self.arrived += 1
        if self.arrived < len(self.inputs):
            state.held = []
            return
        self.aligning = NO_BARRIER
        actions.append(self._snapshot(checkpoint_id, park))
        if not self.parked:
            self._release_held(actions)

    def _release_held(self, actions: list) -> None:
        """Process the frames held behind a barrier (or while parked), in order."""
        for held_sender, held_state in self.inputs.items():
            held, held_state.held = held_state.held, None
            for frame in held or ():
                if held_state.held is not None:  # the next barrier came on this channel
                    held_state.held.append(frame)
                else:
                    self._process(held_sender, held_state, frame, actions)

    def completed(self, checkpoint_id: int) -> None:
        """Checkpoint ``checkpoint_id`` completed: later snapshots build on its."""
        self.lineage.completed(checkpoint_id)

    def compacted(self, checkpoint_id: int) -> None:
        """The AppMaster made the snapshots of ``checkpoint_id`` whole: later chains are shorter."""
        self.lineage.compacted(checkpoint_id)

    def _snapshot(self, checkpoint_id: int, park: bool = False) -> Snapshot:
        """The task's state for ``checkpoint_id``: as what changed since the base
        :class:`Lineage` picks, where the task keeps track (``snapshot_since``). ``park``:
        from now on every input is held (see :meth:`rewire`)."""
        self.task.prepare_checkpoint(checkpoint_id)
        self.last_checkpoint = checkpoint_id
        link, base = self.lineage.plan(checkpoint_id, self.epoch)
        since = getattr(self.task, "snapshot_since", None)
        taken = since(base.checkpoint_id if base is not None else None) if since is not None else self.task.snapshot()
        if base is not None and (since is None or not self.task.builds_on_base(taken)):
            link, base = self.lineage.taken_whole(checkpoint_id), None
        held = (self.hold_from, tuple(self.held)) if self.hold_from is not None else None
        keep_copy = getattr(self.task, "keep_copy", None)
        state = TaskSnapshot(checkpoint_id, taken, self.ended, self.watermark, self.epoch,
                             (base.checkpoint_id, base.epoch) if base is not None else None, link.depth, link.root,
                             held, keep_copy(checkpoint_id) if keep_copy is not None else ())
        if park:
            self.parked = True
            for held_state in self.inputs.values():
                if held_state.held is None:
                    held_state.held = []
        return Snapshot(checkpoint_id, state, self.ended, self._take_output(), self.output_watermark, self.records_in,
                        park)


def debloated_window(records: int, frames: int, seconds: float, target_s: float, inputs: int, most: int) -> int:
    """The credit window (frames per input) that keeps what is in flight to a task at about
    ``target_s`` of its processing: ``records`` in ``frames`` took ``seconds``, and
    ``inputs`` senders share it. Between MIN_WINDOW and ``most``; ``most`` when nothing
    was measured (no records, or no time)."""
    if records <= 0 or seconds <= 0:
        return most
    in_target = target_s * records / seconds  # the records the task processes in the target
    per_frame = records / frames
    window = in_target / per_frame / max(inputs, 1)  # inputs: those still open
    return most if not math.isfinite(window) else max(MIN_WINDOW, min(most, math.ceil(window)))

