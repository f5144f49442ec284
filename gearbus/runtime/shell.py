"""The shell application type's AppMaster decisions: a state machine without I/O.

A shell app (``gearbus shell``, Gearpump's distributed shell) runs one command on each of
a list of workers, one executor per worker, and keeps what each command writes until a
reader has it. The AppMaster's async shell (services/appmaster/shell.py) feeds this machine
events (started, a slot granted or refused, an executor launched, registered or stopped, a
worker lost, lines, an exit, a tick with the time, the process being stopped, the state
report answered) and carries out the instructions it returns. It never awaits, reads a
clock or touches NATS, so every ordering is tested without a network (as the streaming
AppMaster's machine, gearbus/runtime/appmaster_state.py, is).

Each worker's command is in one state; ``_COMMAND_MOVES`` enforces the moves::

    state      event                                     -> state      instructions
    (new)      start                                     WAITING    RequestSlot
    WAITING    slot granted                              STARTING   LaunchExecutor
    STARTING   executor registered                       RUNNING
    RUNNING    its deadline passed (--timeout after it   STOPPING   StopCommand
                 registered)
    RUNNING,   exited (ShellExited)                      EXITED
    STOPPING
    WAITING,   slot refused, launch failed, executor     LOST
    STARTING,    stopped or worker lost before its exit
    RUNNING,
    STOPPING

and the app in one phase (``_PHASE_MOVES``)::

    phase      event                                     -> phase      instructions
    (new)      start                                     RUNNING    RequestSlot per worker
    RUNNING    no command waits or starts, one runs      RUNNING    ReportState(ACTIVE), once
    RUNNING    every command EXITED or LOST              REPORTING  StoreOutput, ReportState(SUCCEEDED | FAILED)
    RUNNING    the process is stopped (a kill)           STOPPING   (its executors are being stopped too)
    STOPPING   every command EXITED or LOST, or          ENDED      StoreOutput
                 the wait for them is over (stop_waited)
    STARTING,  the process is stopped                    ENDED      StoreOutput (what there is)
    REPORTING
    REPORTING  the end's report answered                 ENDED      Shutdown

A killed app's end is the master's (TERMINATED): its AppMaster and executors get SIGTERM at
once, each executor ends its command and reports how, and the AppMaster keeps the output
once every command's end came, or when it can wait no longer, so a reader sees how each
command ended.

The app SUCCEEDED when every command exited 0; else it FAILED, its error naming each worker
whose command exited non-zero (or was lost, or stopped at the deadline).

Output is kept per worker, in order, numbered from line 0: the last ``SHELL_OUTPUT_BYTES`` of
it (line text, and ``SHELL_LINE_OVERHEAD`` per line; a line longer than ``MAX_SHELL_LINE_CHARS``
is cut). Past the bound the
oldest lines go, and a reader asking for them is told how many it missed (``dropped``), so a
reader that keeps up loses nothing, and one that comes late (the command ran before it
asked) gets everything still kept.
"""

from __future__ import annotations

import collections
import enum
from dataclasses import dataclass

from gearbus.runtime.appmaster_state import Logged, Refused
from gearbus.runtime.stimuli import StimulusLog, stimulus
from shared.messages import (MAX_SHELL_LINE_CHARS, SHELL_LINE_OVERHEAD, SHELL_OUTPUT_BYTES, AppError, AppState,
                             ErrorCode, ShellLine, ShellStream, ShellWorkerOutput)

CUT_MARK = " [cut]"  # ends a line cut at MAX_SHELL_LINE_CHARS


class WorkerChoiceError(ValueError):
    """``--workers`` names what the cluster does not have; the text names what it has."""


def choose_workers(selection: str, alive: list[str]) -> list[str]:
    """The workers a shell command runs on: ``all`` (every live worker), ``N`` (the first N
    live workers, by id) or ``ID,ID,...`` (those, each once, in that order)."""
    alive = sorted(alive)
    have = f"the cluster has {len(alive)} live worker(s)" + (f": {', '.join(alive)}" if alive else "")
    selection = selection.strip()
    if selection == "all":
        if not alive:
            raise WorkerChoiceError(f"--workers all: {have}")
        return alive
    if selection.isdigit():
        count = int(selection)
        if count < 1 or count > len(alive):
            raise WorkerChoiceError(f"--workers {count}: {have}")
        return alive[:count]
    asked = [w.strip() for w in selection.split(",")]
    if not selection or not all(asked):
        raise WorkerChoiceError(f"--workers {selection!r}: write all, a number, or worker ids joined by commas "
                                "(gearbus info lists them)")
    doubled = sorted({w for w in asked if asked.count(w) > 1})
    if doubled:
        raise WorkerChoiceError(f"--workers names {', '.join(doubled)} more than once")
    unknown = [w for w in asked if w not in alive]
    if unknown:
        raise WorkerChoiceError(f"--workers: no live worker {', '.join(unknown)}; {have}")
    return asked


def cut(text: str) -> str:
    """A line as kept: cut at MAX_SHELL_LINE_CHARS."""
    return text if len(text) <= MAX_SHELL_LINE_CHARS else text[:MAX_SHELL_LINE_CHARS] + CUT_MARK


class Phase(enum.Enum):
    STARTING = "starting"  # not started yet
    RUNNING = "running"  # commands starting or running
    STOPPING = "stopping"  # the app was killed: waiting for its commands' ends, to keep them with the output
    REPORTING = "reporting"  # every command ended; the app's end is being reported
    ENDED = "ended"


class Command(enum.Enum):
    WAITING = "waiting"  # for its slot on the worker
    STARTING = "starting"  # its executor launched, not registered
    RUNNING = "running"
    STOPPING = "stopping"  # asked to stop (the deadline passed)
    EXITED = "exited"
    LOST = "lost"  # never ran, or its executor ended without reporting its exit


ENDED_COMMANDS = frozenset({Command.EXITED, Command.LOST})

_PHASE_MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.STARTING: frozenset({Phase.RUNNING, Phase.ENDED}),
    Phase.RUNNING: frozenset({Phase.REPORTING, Phase.STOPPING, Phase.ENDED}),
    Phase.STOPPING: frozenset({Phase.ENDED}),
    Phase.REPORTING: frozenset({Phase.ENDED}),
    Phase.ENDED: frozenset(),
}

_COMMAND_MOVES: dict[Command, frozenset[Command]] = {
    Command.WAITING: frozenset({Command.STARTING, Command.LOST}),
    Command.STARTING: frozenset({Command.RUNNING, Command.LOST}),
    Command.RUNNING: frozenset({Command.STOPPING, Command.EXITED, Command.LOST}),
    Command.STOPPING: frozenset({Command.EXITED, Command.LOST}),
    Command.EXITED: frozenset(),
    Command.LOST: frozenset(),
}


# -- instructions: what the async shell carries out ---------------------------------------------

@dataclass(frozen=True)
class RequestSlot:
    """Ask the master for one slot on ``worker_id``; then ``slot_granted`` or ``slot_refused``."""
    executor_id: int
    worker_id: str


@dataclass(frozen=True)
class LaunchExecutor:
    """Have the master start executor ``executor_id`` on ``worker_id`` (it runs the command);
    ``launch_failed`` if it cannot."""
    executor_id: int
    worker_id: str


@dataclass(frozen=True)
class StopCommand:
    """Ask the executor to end its command (StopShellCommand); it then reports the exit."""
    executor_id: int
    reason: str


@dataclass(frozen=True)
class StoreOutput:
    """Keep every worker's output and end (``outputs()``) where readers find it once this
    AppMaster is gone (the checkpoint KV bucket)."""


@dataclass(frozen=True)
class ReportState:
    """Tell the master the app's end; then ``state_reported``."""
    state: str
    error: AppError | None = None


@dataclass(frozen=True)
class Shutdown:
    """Stop the executors still running and end this AppMaster."""
    reason: str


Instruction = RequestSlot | LaunchExecutor | StopCommand | StoreOutput | ReportState | Shutdown | Logged


@dataclass
class _Worker:
    """One worker's command: its executor, its state and its output (a bounded window)."""

    worker_id: str
    state: Command = Command.WAITING
    exit_code: int | None = None
    detail: str = ""
    lines: collections.deque = None  # ShellLine, the kept ones
    first_line: int = 0  # the number of lines[0]
    kept_bytes: int = 0
    next_seq: int = 0  # the ShellLines batch expected next
    deadline: float | None = None  # when it is stopped (--timeout after its executor registered)
    timed_out: bool = False  # it was stopped at its deadline: a failure, however it exited

    def __post_init__(self):
        self.lines = collections.deque()

    @property
    def total_lines(self) -> int:
        return self.first_line + len(self.lines)

    def keep(self, lines: list[ShellLine], bound: int) -> None:
        for line in lines:
            line = ShellLine(line.stream, cut(line.text))
            self.lines.append(line)
            self.kept_bytes += _size(line)
        while self.kept_bytes > bound and len(self.lines) > 1:
            self.kept_bytes -= _size(self.lines.popleft())
            self.first_line += 1


#: The most line bytes one read answers with (beside one line of a worker when less came before).
MAX_READ_BYTES = 512 * 1024


def _size(line: ShellLine) -> int:
    return len(line.text.encode("utf-8", "surrogatepass")) + SHELL_LINE_OVERHEAD


class ShellAppState:
    """One shell app's life in its AppMaster: ``workers`` (one executor each, executor id =
    position), ``timeout_s`` (0: none) from the start."""

    def __init__(self, workers: list[str], timeout_s: float = 0.0, output_bytes: int = SHELL_OUTPUT_BYTES):
        if not workers:
            raise ValueError("a shell app runs on at least one worker")
        if len(set(workers)) != len(workers):
            raise ValueError(f"a shell app runs once per worker, not on {workers}")
        if timeout_s < 0:
            raise ValueError(f"timeout_s must not be negative, got {timeout_s}")
        self.workers = [_Worker(w) for w in workers]
        self.timeout_s = float(timeout_s)
        self.output_bytes = output_bytes
        self.phase = Phase.STARTING
        self.stopped = ""  # why the process was stopped (a kill), if it was
        self.outcome: tuple[str, AppError | None] | None = None
        self.active_reported = False
        self.changes = 0  # counts every change a reader could see (new lines, a state): long polls wait on it
        self.stimuli = StimulusLog(quiet=frozenset({"tick", "lines"}))

    # -- queries -----------------------------------------------------------------------------

    @property
    def ended(self) -> bool:
        return self.phase in (Phase.REPORTING, Phase.ENDED)

    def executor(self, executor_id: int) -> _Worker:
        if not 0 <= executor_id < len(self.workers):
            raise Refused(ErrorCode.NOT_FOUND, f"this shell app launched no executor {executor_id}")
        return self.workers[executor_id]

    def live_executors(self) -> list[tuple[int, str]]:
        """(executor id, worker) of the executors that may still run."""
        return [(i, w.worker_id) for i, w in enumerate(self.workers)
                if w.state in (Command.STARTING, Command.RUNNING, Command.STOPPING)]

    def output(self, offsets: dict[str, int], max_bytes: int) -> list[ShellWorkerOutput]:
        """Each worker's lines from ``offsets[worker]`` on (within ``max_bytes`` of text in all,
        at least one line each), and its state."""
        return read(self.outputs(), offsets, max_bytes)

    def outputs(self) -> list[ShellWorkerOutput]:
        """Everything kept of each worker: what StoreOutput keeps."""
        return [ShellWorkerOutput(w.worker_id, w.state.value, w.first_line, list(w.lines), w.total_lines,
                                  w.total_lines, 0, w.exit_code, w.detail) for w in self.workers]

    # -- events --------------------------------------------------------------------------------

    @stimulus
    def start(self, now: float) -> list[Instruction]:
        self._move(Phase.RUNNING)
        return [RequestSlot(i, w.worker_id) for i, w in enumerate(self.workers)]

    @stimulus
    def slot_granted(self, executor_id: int) -> list[Instruction]:
        worker = self.executor(executor_id)
        if worker.state is not Command.WAITING:
            return []
        self._command(worker, Command.STARTING)
        return [LaunchExecutor(executor_id, worker.worker_id)]

    @stimulus
    def slot_refused(self, executor_id: int, reason: str) -> list[Instruction]:
        return self._lose(self.executor(executor_id), f"no slot on the worker: {reason}")

    @stimulus
    def launch_failed(self, executor_id: int, reason: str) -> list[Instruction]:
        return self._lose(self.executor(executor_id), f"its executor could not be launched: {reason}")

    @stimulus
    def executor_registered(self, executor_id: int, worker_id: str, now: float) -> list[Instruction]:
        """Raises Refused for an executor this app did not launch there, or whose command
        has ended (it then exits without running it)."""
        worker = self.executor(executor_id)
        if worker_id != worker.worker_id:
            raise Refused(ErrorCode.CONFLICT, f"executor {executor_id} belongs on worker {worker.worker_id}, "
                                              f"not {worker_id}")
        if worker.state is not Command.STARTING:
            raise Refused(ErrorCode.CONFLICT, f"executor {executor_id} is {worker.state.value}: "
                                              "its command does not run (again)")
        self._command(worker, Command.RUNNING)
        worker.deadline = now + self.timeout_s if self.timeout_s else None
        return self._maybe_active()

    @stimulus
    def lines(self, executor_id: int, seq: int, lines: list[ShellLine]) -> list[Instruction]:
        """A batch of the command's lines; a batch sent again (its answer was lost) is kept once."""
        worker = self.executor(executor_id)
        if worker.state not in (Command.RUNNING, Command.STOPPING):
            raise Refused(ErrorCode.CONFLICT, f"executor {executor_id} is {worker.state.value}: no lines expected")
        if seq < worker.next_seq:
            return []
        bad = sorted({line.stream for line in lines} - ShellStream.ALL)
        if bad:
            raise Refused(ErrorCode.BAD_REQUEST, f"unknown output stream(s) {bad}: stdout or stderr")
        worker.next_seq = seq + 1
        worker.keep(lines, self.output_bytes)
        self.changes += 1
        return []

    @stimulus
    def exited(self, executor_id: int, exit_code: int, reason: str) -> list[Instruction]:
        worker = self.executor(executor_id)
        if worker.state in ENDED_COMMANDS:
            return []
        if worker.state not in (Command.RUNNING, Command.STOPPING):
            raise Refused(ErrorCode.CONFLICT, f"executor {executor_id} is {worker.state.value}: it runs no command")
        self._command(worker, Command.EXITED)
        worker.exit_code, worker.detail = exit_code, reason or worker.detail
        return self._maybe_end()

    @stimulus
    def executor_stopped(self, executor_id: int, detail: str) -> list[Instruction]:
        """Its worker says the executor process exited: a command not reported ended is lost."""
        if not 0 <= executor_id < len(self.workers):
            return []
        return self._lose(self.workers[executor_id], f"its executor {detail} before the command's end was reported")

    @stimulus
    def worker_lost(self, worker_id: str) -> list[Instruction]:
        out: list[Instruction] = []
        for worker in self.workers:
            if worker.worker_id == worker_id:
                out += self._lose(worker, "its worker was lost")
        return out

    @stimulus
    def tick(self, now: float) -> list[Instruction]:
        """Commands running past their deadline are stopped."""
        out: list[Instruction] = []
        for executor_id, worker in enumerate(self.workers):
            if worker.state is Command.RUNNING and worker.deadline is not None and now >= worker.deadline:
                out += [Logged("shell_timed_out", "warning", (("worker_id", worker.worker_id),
                                                              ("timeout_s", self.timeout_s)))]
                out += self._stop(executor_id, worker)
        return out

    @stimulus
    def stopping(self, reason: str) -> list[Instruction]:
        """This AppMaster's process is being stopped (the app was killed): keep the output,
        with how each command ended once that came (``stop_waited`` when it can wait no more)."""
        if self.phase in (Phase.ENDED, Phase.STOPPING):
            return []
        self.stopped = reason
        if self.phase is Phase.REPORTING:  # already kept
            self._move(Phase.ENDED)
            return []
        for worker in self.workers:
            if worker.state in (Command.WAITING, Command.STARTING):
                self._command(worker, Command.LOST)
                worker.detail = f"not started: {reason}"
        if self.phase is Phase.RUNNING and self.live_executors():
            self._move(Phase.STOPPING)
            return []
        self._move(Phase.ENDED)
        return [StoreOutput()]

    @stimulus
    def stop_waited(self) -> list[Instruction]:
        """This AppMaster waits for its commands' ends no longer: keep what there is."""
        if self.phase is not Phase.STOPPING:
            return []
        for worker in self.workers:
            if worker.state not in ENDED_COMMANDS:
                self._command(worker, Command.LOST)
                worker.detail = f"its end did not come before {self.stopped}"
        self._move(Phase.ENDED)
        return [StoreOutput()]

    @stimulus
    def state_reported(self, state: str, error: str = "") -> list[Instruction]:
        """The master answered a ReportState (``error``: it could not be told)."""
        out: list[Instruction] = [Logged("state_report_failed", "error", (("state", state), ("error", error)))] \
            if error else []
        if state not in AppState.TERMINAL or self.phase is not Phase.REPORTING:
            return out
        self._move(Phase.ENDED)
        return out + [Shutdown(f"the shell app {self.outcome[0]}")]

    # -- transitions -----------------------------------------------------------------------------

    def _move(self, phase: Phase) -> None:
        if phase not in _PHASE_MOVES[self.phase]:
            raise AssertionError(f"shell app phase {self.phase} -> {phase} is not a transition")
        self.phase = phase
        self.changes += 1

    def _command(self, worker: _Worker, state: Command) -> None:
        if state not in _COMMAND_MOVES[worker.state]:
            raise AssertionError(f"command on {worker.worker_id}: {worker.state} -> {state} is not a transition")
        worker.state = state
        self.changes += 1

    def _stop(self, executor_id: int, worker: _Worker) -> list[Instruction]:
        self._command(worker, Command.STOPPING)
        worker.timed_out = True
        worker.detail = f"stopped: it ran past the {self.timeout_s:g} s timeout"
        return [StopCommand(executor_id, worker.detail)]

    def _lose(self, worker: _Worker, why: str) -> list[Instruction]:
        if worker.state in ENDED_COMMANDS:
            return []
        self._command(worker, Command.LOST)
        worker.detail = why
        return [Logged("shell_command_lost", "warning", (("worker_id", worker.worker_id), ("why", why)))] \
            + (self._maybe_end() or self._maybe_active())

    def _maybe_active(self) -> list[Instruction]:
        if self.active_reported or self.phase is not Phase.RUNNING or any(
                w.state in (Command.WAITING, Command.STARTING) for w in self.workers):
            return []
        self.active_reported = True
        return [ReportState(AppState.ACTIVE)]

    def _maybe_end(self) -> list[Instruction]:
        if self.phase not in (Phase.RUNNING, Phase.STOPPING) or any(
                w.state not in ENDED_COMMANDS for w in self.workers):
            return []
        if self.phase is Phase.STOPPING:  # killed: the master decided the app's end
            self._move(Phase.ENDED)
            return [StoreOutput()]
        failed = [w for w in self.workers if w.state is Command.LOST or w.exit_code != 0 or w.timed_out]
        if not failed:
            self.outcome = (AppState.SUCCEEDED, None)
        else:
            what = "; ".join(f"{w.worker_id}: " + (f"exit code {w.exit_code}" if w.state is Command.EXITED
                                                   else "lost") + (f" ({w.detail})" if w.detail else "")
                             for w in failed)
            kind = "TimedOut" if all(w.timed_out for w in failed) else "CommandLost" if all(
                w.state is Command.LOST for w in failed) else "CommandFailed"
            self.outcome = (AppState.FAILED, AppError(
                kind, f"the command failed on {len(failed)} of {len(self.workers)} worker(s): {what}",
                "the shell command"))
        self._move(Phase.REPORTING)
        return [StoreOutput(), ReportState(*self.outcome)]

    # -- invariants ------------------------------------------------------------------------------

    def validate(self) -> None:
        """Raise AssertionError if the machine's state is inconsistent (run by the tests after every event)."""
        ended = all(w.state in ENDED_COMMANDS for w in self.workers)
        assert self.phase is not Phase.REPORTING or (ended and self.outcome is not None), self.phase
        assert self.phase not in (Phase.RUNNING, Phase.STOPPING) or not ended, "every command ended, but not the app"
        assert self.phase is not Phase.STOPPING or (self.stopped and self.outcome is None), self.phase
        assert self.phase is not Phase.STARTING or all(w.state is Command.WAITING for w in self.workers)
        assert (self.outcome is None) or ended, "an outcome before every command ended"
        assert self.outcome is None or (self.outcome[0] == AppState.SUCCEEDED) == all(
            w.state is Command.EXITED and w.exit_code == 0 and not w.timed_out for w in self.workers), self.outcome
        for w in self.workers:
            assert (w.exit_code is not None) == (w.state is Command.EXITED), w
            assert w.kept_bytes == sum(_size(line) for line in w.lines), w.worker_id
            assert w.kept_bytes <= self.output_bytes or len(w.lines) == 1, w.worker_id
            assert all(len(line.text) <= MAX_SHELL_LINE_CHARS + len(CUT_MARK) for line in w.lines), w.worker_id
            assert w.first_line >= 0 and w.next_seq >= 0
            assert w.state is not Command.STOPPING or w.timed_out, w
            assert not w.timed_out or (self.timeout_s > 0 and w.state in (Command.STOPPING, *ENDED_COMMANDS)), w
            assert w.deadline is None or (self.timeout_s > 0 and w.state not in (Command.WAITING, Command.STARTING)), w


def read(outputs: list[ShellWorkerOutput], offsets: dict[str, int], max_bytes: int) -> list[ShellWorkerOutput]:
    """Each worker's kept lines from ``offsets[worker]`` (0 when absent) on, within
    ``max_bytes`` of text in all (at most MAX_READ_BYTES) but at least one line per worker
    with any while the reply holds less than MAX_READ_BYTES (so it stays under NATS's
    payload limit, however many workers): from the AppMaster's machine, or from what it
    stored. A reader reads on from each ``next_line``."""
    budget, total, views = min(max(max_bytes, 0), MAX_READ_BYTES), 0, []
    for out in outputs:
        offset = max(int(offsets.get(out.worker_id, 0)), 0)
        start = max(offset, out.first_line)
        dropped = max(out.first_line - offset, 0)
        taken, size = [], 0
        for line in out.lines[min(start - out.first_line, len(out.lines)):]:
            if (taken or total >= MAX_READ_BYTES) and size + _size(line) > budget:
                break
            taken.append(line)
            size += _size(line)
        budget, total = max(budget - size, 0), total + size
        next_line = start + len(taken)
        views.append(ShellWorkerOutput(out.worker_id, out.status, start, taken, next_line, out.total_lines,
                                       dropped, out.exit_code, out.detail))
    return views
