"""Every protocol message of gearbus: typed, versioned, msgpack-encoded.

On the wire a message is a msgpack map ``{"type": <class name>, "v": <version>,
<fields in snake_case>...}``. Decoding checks the tag, the version and every field's
type and raises :class:`ProtocolError` naming what is wrong, so a peer written in any
language gets a precise answer. Fields added later carry defaults, so older peers
that omit them keep working; unknown fields are ignored for the same reason.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, ClassVar, Union

import msgpack

PROTOCOL_VERSION = 1

#: The largest control-plane message a service accepts (data frames are separate).
MAX_MESSAGE_BYTES = 8 * 1024 * 1024


class ProtocolError(ValueError):
    """A message could not be decoded; the text says exactly why."""


class _FieldCheck:
    """Validates one decoded field value against its annotated type."""

    def __init__(self, hint: Any):
        self.hint = hint
        self.check = _compile(hint)

    def __call__(self, value: Any, where: str) -> Any:
        return self.check(value, where)


def _type_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


def _compile(hint: Any):
    """Turn a type hint into a function (value, where) -> converted value."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return lambda value, where: value
    if origin in (Union, types.UnionType):
        options = typing.get_args(hint)
        allows_none = type(None) in options
        inner = [o for o in options if o is not type(None)]
        if len(inner) != 1:
            raise TypeError(f"unsupported union {hint}")
        check_inner = _compile(inner[0])

        def check_optional(value, where):
            if value is None:
                if allows_none:
                    return None
            return check_inner(value, where)

        return check_optional
    if origin in (list, tuple):
        args = typing.get_args(hint)
        check_item = _compile(args[0]) if args else (lambda v, w: v)

        def check_list(value, where):
            if not isinstance(value, (list, tuple)):
                raise ProtocolError(f"{where}: expected a list, got {type(value).__name__}")
            return [check_item(item, f"{where}[{i}]") for i, item in enumerate(value)]

        return check_list
    if origin is dict:
        key_hint, value_hint = typing.get_args(hint) or (Any, Any)
        check_key, check_value = _compile(key_hint), _compile(value_hint)

        def check_dict(value, where):
            if not isinstance(value, dict):
                raise ProtocolError(f"{where}: expected a map, got {type(value).__name__}")
            return {
                check_key(k, f"{where} key"): check_value(v, f"{where}[{k!r}]")
                for k, v in value.items()
            }

        return check_dict
    if isinstance(hint, type) and issubclass(hint, Struct):
        def check_struct(value, where):
            if not isinstance(value, dict):
                raise ProtocolError(f"{where}: expected a {hint.__name__} map, got {type(value).__name__}")
            return hint._from_fields(value, where)

        return check_struct
    if hint is float:
        def check_float(value, where):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ProtocolError(f"{where}: expected a number, got {type(value).__name__}")
            return float(value)

        return check_float
    if hint is int:
        def check_int(value, where):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ProtocolError(f"{where}: expected an integer, got {type(value).__name__}")
            return value

        return check_int
    if hint in (str, bool, bytes):
        def check_exact(value, where):
            if not isinstance(value, hint) or (hint is not bool and isinstance(value, bool)):
                raise ProtocolError(f"{where}: expected {hint.__name__}, got {type(value).__name__}")
            return value

        return check_exact
    raise TypeError(f"unsupported field type {_type_name(hint)}")


class Struct:
    """A frozen dataclass carried inside messages as a plain msgpack map. Its ``==``, hash
    and repr are the dataclass's, written once here: generated for each class (an ``exec``
    each), they cost every role process ~30 ms of its start-up."""

    _checks: ClassVar[dict[str, _FieldCheck]]
    _required: ClassVar[frozenset[str]]
    _field_names: ClassVar[tuple[str, ...]]

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
        cls._field_names = tuple(f.name for f in dataclasses.fields(cls))
        cls._checks = None  # resolved lazily: hints may name classes defined later

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._field_names)

    def __eq__(self, other):
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self._values() == other._values()

    def __hash__(self):
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._field_names)
        return f"{type(self).__qualname__}({fields})"

    @classmethod
    def _resolve(cls) -> None:
        hints = typing.get_type_hints(cls)
        fields = dataclasses.fields(cls)
        cls._checks = {f.name: _FieldCheck(hints[f.name]) for f in fields}
        cls._required = frozenset(
            f.name
            for f in fields
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        )

    @classmethod
    def _from_fields(cls, data: dict, where: str):
        if cls._checks is None:
            cls._resolve()
        missing = cls._required - data.keys()
        if missing:
            raise ProtocolError(f"{where}: missing field(s) {', '.join(sorted(missing))}")
        values = {}
        for name, check in cls._checks.items():
            if name in data:
                values[name] = check(data[name], f"{where}.{name}")
        return cls(**values)

    def to_wire(self) -> dict:
        return {name: _to_wire(getattr(self, name)) for name in self._field_names}


def _to_wire(value: Any) -> Any:
    if isinstance(value, Struct):
        return value.to_wire()
    if isinstance(value, (list, tuple)):
        return [_to_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _to_wire(v) for k, v in value.items()}
    return value


class Message(Struct):
    """A protocol message: a Struct with a type tag, registered by subclassing."""

    registry: ClassVar[dict[str, type[Message]]] = {}

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        Message.registry[cls.__name__] = cls

    def encode(self) -> bytes:
        body = self.to_wire()
        body["type"] = type(self).__name__
        body["v"] = PROTOCOL_VERSION
        return msgpack.packb(body, use_bin_type=True)


def decode(data: bytes, expected: tuple[type[Message], ...] = ()) -> Message:
    """Decode and validate a message; optionally insist on one of ``expected`` types."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the limit of {MAX_MESSAGE_BYTES}")
    try:
        body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except Exception as exc:
        raise ProtocolError(f"not valid msgpack ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})") from None
    if not isinstance(body, dict):
        raise ProtocolError(f"expected a msgpack map, got {type(body).__name__}")
    tag = body.get("type")
    if tag is None:
        raise ProtocolError('message has no "type" field')
    cls = Message.registry.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise ProtocolError(f"unknown message type {tag!r}")
    version = body.get("v")
    if version is None:
        raise ProtocolError(f'{tag}: message has no protocol version field "v"')
    if version != PROTOCOL_VERSION:
        raise ProtocolError(
            f"{tag}: protocol version {version!r} is not supported; this peer speaks version {PROTOCOL_VERSION}"
        )
    if expected and cls not in expected:
        names = ", ".join(e.__name__ for e in expected)
        raise ProtocolError(f"unexpected message type {tag}; expected {names}")
    try:
        return cls._from_fields(body, tag)
    except ProtocolError:
        raise
    except (TypeError, ValueError, RecursionError) as exc:  # a field the checks passed but the class refuses
        raise ProtocolError(f"{tag}: {type(exc).__name__}: {exc}") from None


# --- shared payload structs ------------------------------------------------------


class AppState:
    """Application states (Gearpump's): a plain namespace of string constants."""

    PENDING = "PENDING"
    ACTIVE = "ACTIVE"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    TERMINATED = "TERMINATED"
    TERMINAL = frozenset({SUCCEEDED, FAILED, TERMINATED})
    ALL = frozenset({PENDING, ACTIVE, SUCCEEDED, FAILED, TERMINATED})


class Placement:
    """Where the Scheduler may put the slots of one resource request."""

    ANY = "any"  # spread over the workers with the most free slots
    ONE_WORKER = "one_worker"  # all slots on a single worker
    WORKER = "worker"  # all slots on the worker named in the request
    ALL = frozenset({ANY, ONE_WORKER, WORKER})


class ExecutorKind:
    APPMASTER = "appmaster"
    EXECUTOR = "executor"


class AppType:
    """Application types (Gearpump's templates on one AppMaster/Executor machinery): what an
    app's AppMaster decides and what its executors run (docs/application-types.md). A type
    name is letters, digits and "_"; a third type is installed as a plug-in."""

    STREAMING = "streaming"  # a DAG of processors joined by partitioners (the default)
    SHELL = "shell"  # a command run on chosen workers (`gearbus shell`): submitted on app.submit.shell only


class ShellStream:
    """Which output of a shell command a line came from."""

    STDOUT = "stdout"
    STDERR = "stderr"
    ALL = frozenset({STDOUT, STDERR})


class TaskId(Struct):
    processor: int
    index: int

    def named(self, names: dict[int, str]) -> str:
        """The task as a user reads it: its processor's name (``names``: by processor id)
        and its index, e.g. ``count[1]``; ``task 3.1`` where the name is not known."""
        name = names.get(self.processor)
        return f"{name}[{self.index}]" if name else f"task {self.processor}.{self.index}"


#: Upper bounds (ms) of the buckets of ``TaskCounters.batch_ms_buckets``; the last bucket is
#: everything above the last bound.
BATCH_MS_BOUNDS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 50.0, 100.0, 250.0, 500.0, 1000.0)


class TaskCounters(Struct):
    """One task's counters since it started (this attempt), measured where they arise."""

    task: TaskId
    records_in: int = 0
    records_out: int = 0
    frames_in: int = 0
    frames_out: int = 0
    watermark: int = 0
    finished: bool = False
    messages_dropped: int = 0
    late_records: int = 0
    stale_frames: int = 0  # frames of another attempt (a replaced task's), dropped unread
    latest_event_ms: int | None = None  # the newest event time of a batch's last record it processed (None: none)
    dead_letters: int = 0  # source messages that did not decode (sent to the dead-letter subject)
    epoch: int = 0
    executor_id: int = -1  # the executor running this task (its log: ``gearbus logs --task``)
    bytes_in: int = 0  # encoded frame bytes received
    bytes_out: int = 0  # encoded frame bytes sent
    inbox_depth: int = 0  # messages waiting in the task's inbox now
    backpressure_ms: float = 0.0  # time spent waiting for a receiver's credit
    busy_ms: float = 0.0  # time spent processing batches (the sum of the histogram below)
    batch_ms_buckets: list[int] = dataclasses.field(default_factory=list)  # batches per BATCH_MS_BOUNDS bucket
    state_keys: int = 0  # keyed entries its stateful steps hold now (a key per window it is in)
    state_bytes: int = 0  # their size, estimated from a sample


class ProcessorInfo(Struct):
    id: int
    name: str
    parallelism: int
    task: str = ""  # the task class
    files: dict[str, str] = dataclasses.field(default_factory=dict)  # step -> the absolute path it reads or writes


class EdgeInfo(Struct):
    source: int  # processor ids
    target: int
    partitioner: str


class AppDag(Struct):
    """The app's plan as its AppMaster runs it: processors and the partitioned edges between them."""

    processors: list[ProcessorInfo] = dataclasses.field(default_factory=list)
    edges: list[EdgeInfo] = dataclasses.field(default_factory=list)


class ProcessorMetrics(Struct):
    """One processor's tasks summed up by its AppMaster: totals go on across rescales and
    recoveries (what ended attempts counted is carried); rates and shares are over the last
    heartbeat interval with a report."""

    processor: int
    name: str
    parallelism: int
    records_in: int = 0
    records_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    records_in_per_s: float = 0.0
    records_out_per_s: float = 0.0
    watermark: int | None = None  # the lowest of its tasks' (None before any)
    watermark_lag_ms: int | None = None  # now - watermark, while a task has not ended
    backpressure: float = 0.0  # the highest share of time one of its tasks waited for credit (0..1)
    busy: float = 0.0  # the highest share of time one of its tasks spent processing (0..1)
    latency_p50_ms: float | None = None  # batch processing time, from the merged histogram
    latency_p99_ms: float | None = None
    inbox_depth: int = 0
    late_records: int = 0
    messages_dropped: int = 0
    dead_letters: int = 0
    finished_tasks: int = 0
    state_keys: int = 0  # keyed entries its tasks' stateful steps hold now
    state_bytes: int = 0  # their estimated size


class ProcessorCheckpoint(Struct):
    """What one processor's tasks wrote for a checkpoint."""

    processor: int
    size_bytes: int
    tasks: int  # of its tasks, those that acknowledged the checkpoint


class AppEvent(Struct):
    """Something that happened to a running app, recorded by its AppMaster when it happened:
    a rescale, a replacement of a processor's code (each state of its version), a restart
    from a checkpoint, the state it reported running in (checkpoints have their own history;
    the master records when the app was submitted and ended)."""

    t_ms: int  # when, epoch ms
    kind: str  # "rescale", "replace", "restart" or "state"
    detail: str


class ProcessorSample(Struct):
    """The figures the dashboard charts of one processor at one moment (ProcessorMetrics')."""

    processor: int
    records_in_per_s: float = 0.0
    backpressure: float = 0.0
    watermark_lag_ms: int | None = None
    state_bytes: int = 0

    @classmethod
    def of(cls, metrics: ProcessorMetrics) -> ProcessorSample:
        return cls(metrics.processor, metrics.records_in_per_s, metrics.backpressure, metrics.watermark_lag_ms,
                   metrics.state_bytes)


class MetricsSample(Struct):
    t_ms: int  # epoch ms
    processors: list[ProcessorSample] = dataclasses.field(default_factory=list)


class CheckpointRecord(Struct):
    """One of an app's last checkpoints, whatever became of it (Flink's checkpoint history)."""

    checkpoint_id: int
    status: str  # "in_progress", "completed" or "failed"
    trigger_ms: int  # when it was triggered (epoch ms)
    duration_ms: int = 0  # from the trigger until it completed or failed; 0 while in progress
    alignment_ms: int = 0  # the longest barrier alignment among the tasks that acknowledged it
    size_bytes: int = 0  # its stored snapshots, summed
    processors: list[ProcessorCheckpoint] = dataclasses.field(default_factory=list)
    failure: str = ""  # why it failed


class CheckpointStats(Struct):
    """The app's checkpoints, for ``gearbus status``."""

    interval_ms: int = 0  # 0: periodic checkpoints are off (bounded apps still end with one)
    last_id: int = 0  # the latest completed checkpoint, 0 for none
    last_completed_ms: int = 0  # when it completed (epoch ms)
    last_duration_ms: int = 0
    last_size_bytes: int = 0
    completed: int = 0
    failed: int = 0  # abandoned, declined or not stored
    last_failure: str = ""
    epoch: int = 0  # the app's attempt: the number of rollbacks to a checkpoint so far
    history: list[CheckpointRecord] = dataclasses.field(default_factory=list)  # the last 20, oldest first


class FailureKind:
    """Whose a task's failure is: the app's (its code or its input: it repeats after a
    restore) or the cluster's (a process died, hung or lost its connection: retried)."""

    USER = "user"
    FAULT = "fault"


class AppError(Struct):
    """A failure as the user sees it: what raised, where, and the Python traceback; for a
    task's, whose it is (``kind``), the step, the record and the user's own line."""

    error_type: str
    message: str
    where: str = ""
    traceback: str = ""
    kind: str = ""  # a FailureKind; "" for a failure of the app's life, not of one task
    step: str = ""  # the step that raised (a task's failure)
    record: str = ""  # a bounded repr of the record it raised on, where there is one
    location: str = ""  # the user's own file and line it raised at, e.g. "counts.py:12"


class WorkerSummary(Struct):
    worker_id: str
    host: str
    pid: int
    slots: int
    slots_used: int
    alive: bool = True
    last_heartbeat_ms: int = 0


class AppSummary(Struct):
    app_id: int
    name: str
    state: str
    submitted_ms: int
    finished_ms: int = 0
    user: str = ""
    error: AppError | None = None
    appmaster_worker: str = ""
    executors: int = 0
    tasks: list[TaskCounters] = dataclasses.field(default_factory=list)
    clock: int | None = None  # the application clock (epoch ms), once the AppMaster reported one
    stalled_tasks: list[str] = dataclasses.field(default_factory=list)
    restarts: int = 0  # executors lost and replaced; the app rolled back to its last checkpoint
    blacklisted_workers: list[str] = dataclasses.field(default_factory=list)
    guarantee: str = ""  # "exactly-once", "at-least-once", "at-most-once" or "none"
    guarantee_detail: str = ""  # which step makes it weaker than exactly-once
    checkpoints: CheckpointStats | None = None
    dag: AppDag | None = None  # once its AppMaster reported it
    processors: list[ProcessorMetrics] = dataclasses.field(default_factory=list)
    versions: list[AppVersion] = dataclasses.field(default_factory=list)  # its code's history (gearbus replace)
    app_type: str = AppType.STREAMING  # what its AppMaster decides and its executors run
    stage_apps: list[int] = dataclasses.field(default_factory=list)  # a multi-stage app's: one app per stage
    stage_of: int = 0  # a stage's: the multi-stage app it is a stage of (0: none)
    stage: int = 0     # ... and which (the stages are numbered from 0)
    streams: list[StreamBacklog] = dataclasses.field(default_factory=list)  # a multi-stage app's
    events: list[AppEvent] = dataclasses.field(default_factory=list)  # as its AppMaster recorded them, oldest first


class StreamBacklog(Struct):
    """One intermediate stream of a multi-stage app, as ``gearbus status`` shows it: what it
    holds is what the stage that reads it has not yet read and checkpointed."""

    name: str
    partitions: int
    from_stage: int
    to_stage: int
    messages: int = 0  # held now (-1: the stream could not be read)
    bytes: int = 0


class Allocation(Struct):
    worker_id: str
    slots: int


class RunningProcess(Struct):
    """A process a worker runs, reported when it (re-)registers."""

    app_id: int
    executor_id: int
    kind: str


# --- errors and acknowledgements -------------------------------------------------


class ErrorReply(Message):
    """The reply to any request that failed. ``code`` is one of the ErrorCode names."""

    code: str
    message: str
    retryable: bool = False


class ErrorCode:
    BAD_REQUEST = "bad_request"  # malformed, unknown type, wrong field or version
    NOT_FOUND = "not_found"  # unknown app id, worker id, executor id, artifact
    CONFLICT = "conflict"  # duplicate id, app already finished
    FORBIDDEN = "forbidden"  # the sender's credential may not ask this (a shell app without the shell grant)
    UNAVAILABLE = "unavailable"  # no resources now, not ready; retry later
    INTERNAL = "internal"  # a handler raised; the message says what
    FENCED = "fenced"  # the sender was declared lost and replaced: it must stop


class Ack(Message):
    """A bare positive reply to a request that returns nothing else."""

    detail: str = ""


# --- client <-> master (app.*) ----------------------------------------------------

#: The framework's own top-level packages. An application module or package of one of these
#: names would shadow it, or be shadowed by it, in the processes that load the app, so
#: SubmitApplication.entry may not be one (nor may a zip artifact hold one at its top level).
FRAMEWORK_PACKAGES = ("gearbus", "services", "shared")


class SubmitApplication(Message):
    """Submit an application whose artifact is already in the artifact object store."""

    name: str
    artifact: str  # object name in the gearbus_artifacts object store
    entry: str  # module to import: the file's stem, or the package name; not one of FRAMEWORK_PACKAGES
    artifact_kind: str = "module"  # "module" (one .py file) or "zip" (a zipped package)
    args: list[str] = dataclasses.field(default_factory=list)
    user: str = ""
    priority: int = 0
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    artifact_digest: str = ""  # SHA-256 (hex) of the artifact as uploaded; "" lets the master take the store's
    #: AppType: what the app's AppMaster decides and its executors run (a shell app: on app.submit.shell only)
    app_type: str = AppType.STREAMING
    #: the live workers the app runs an executor on, one each (a shell app's); the master refuses unknown or lost ones
    workers: list[str] = dataclasses.field(default_factory=list)
    #: the submitter's working directory: the app's relative file paths are paths in it ("": the loading process's)
    submitter_dir: str = ""


class SubmitApplicationResult(Message):
    app_id: int


class IntermediateStreamSpec(Struct):
    """An intermediate stream of a multi-stage app, as its AppMaster planned it."""

    name: str  # the JetStream stream; its subjects are <name>.<partition>
    partitions: int
    edge: str  # the step (or join side) whose records it carries
    from_stage: int
    to_stage: int


class PlanStages(Message):
    """A multi-stage app's AppMaster asks the master (on ``master.app.<id>.stages``) to make
    its intermediate streams and start one app per stage; asked again (a relaunched
    AppMaster), the master answers with the stages it started."""

    app_id: int
    stages: int
    streams: list[IntermediateStreamSpec]


class StagesStarted(Message):
    app_id: int
    stage_apps: list[int]  # stage n's app id at position n


class KillApplication(Message):
    app_id: int


class TakeSavepoint(Message):
    """Write a named checkpoint of a running app (on ``app.savepoint``; the master passes
    it to the app's AppMaster); with ``stop``, the app ends once it is written."""

    app_id: int
    name: str = ""  # letters, digits, "-" and "_"; default "app<id>-<checkpoint id>"
    stop: bool = False


class QueryState(Message):
    """Ask for what a keyed step of a running app holds for one key (on ``app.state``; the
    master passes it to the app's AppMaster, which asks the task that owns the key)."""

    app_id: int
    step: str
    key: str  # JSON: a string is quoted, an array is a tuple


class QueryTaskState(Message):
    """The AppMaster asks the executor hosting ``task`` for its state of ``key`` in ``step``."""

    app_id: int
    task: TaskId
    step: str
    key: str  # JSON, as in QueryState


class StateValue(Message):
    """What a task's step holds for a key, read while the app runs."""

    app_id: int
    step: str
    key: str  # JSON, as asked
    task: TaskId  # the task that owns the key
    found: bool  # false: the step holds nothing for the key
    value: str = "null"  # JSON; what JSON cannot hold appears as its Python repr (a string)


class RescaleApplication(Message):
    """Run steps of a running app at another parallelism (on ``app.rescale``; the master
    passes it to the app's AppMaster): ``gearbus rescale ID STEP=N ...``. Chained steps
    run in one processor and rescale together."""

    app_id: int
    parallelism: dict[str, int]  # step -> the parallelism of the processor holding it


class AppRescaled(Message):
    app_id: int
    processors: dict[str, int]  # processor name -> its parallelism now
    epoch: int  # the epoch the app runs in from now on


class AppVersion(Struct):
    """One version of a running app's code: the first is the app as submitted; each later
    one replaced the code of one processor (``gearbus replace``) with the processor holding
    ``step`` in another artifact. ``state``: "running", "pending" (asked for, not taken
    over yet), "replaced" (a later version runs that processor; version 1 once any of its
    processors is), "rolled back" or "not taken over" (``error`` says why: the previous
    version runs on)."""

    version: int  # from 1
    artifact: str  # object-store name, as SubmitApplication's
    entry: str
    artifact_kind: str
    args: list[str] = dataclasses.field(default_factory=list)
    processor: int = -1  # the processor it replaced (-1: the whole app, version 1)
    step: str = ""
    state: str = "running"
    error: str = ""
    created_ms: int = 0
    dropped_state: list[str] = dataclasses.field(default_factory=list)  # steps whose state it did not take over
    artifact_digest: str = ""  # sha256 of the artifact's bytes, checked by whoever loads it
    submitter_dir: str = ""  # where its relative file paths are (ReplaceProcessor's)


class ReplaceProcessor(Message):
    """Replace the code of the processor holding ``step`` in a running app with that
    step's processor in another artifact (uploaded first, as for SubmitApplication), on
    ``app.replace``; the master passes it to the app's AppMaster: ``gearbus replace ID STEP
    NEW_APP.py``. The new code takes over at the next checkpoint, with the state of the
    steps it keeps (same name and kind); state it would drop needs ``drop_state``."""

    app_id: int
    step: str
    artifact: str
    entry: str
    artifact_kind: str
    args: list[str] = dataclasses.field(default_factory=list)
    drop_state: bool = False
    artifact_digest: str = ""  # sha256 of the artifact's bytes, checked as SubmitApplication's
    #: records of event time before this (epoch ms) are processed by the old code, the rest by
    #: the new (0: the new code takes over at the next checkpoint)
    at_ms: int = 0
    submitter_dir: str = ""  # as SubmitApplication's: the new version's relative file paths are in it


class ProcessorReplaced(Message):
    """The new code runs and took its first checkpoint (a replacement that failed before
    that is rolled back, and the request fails with why)."""

    app_id: int
    version: int
    processor: str  # the replaced processor's name in the new version
    epoch: int
    dropped_state: list[str] = dataclasses.field(default_factory=list)


class QueryMetricsHistory(Message):
    """Ask a running app's AppMaster for the charts' history (on ``app.metrics.history``;
    the master passes it on): each processor's figures over the last 15 minutes."""

    app_id: int


class MetricsHistory(Message):
    """What an AppMaster kept of its processors' figures, a sample every ``interval_ms``
    (its heartbeat's, longer for an app with many processors, so a reply stays small)."""

    app_id: int
    interval_ms: int
    window_ms: int
    processors: list[ProcessorInfo] = dataclasses.field(default_factory=list)  # the plan's, as it runs now
    samples: list[MetricsSample] = dataclasses.field(default_factory=list)  # oldest first


class QueryStimuli(Message):
    """Ask a running app's AppMaster for its state machine's stimulus log (on ``app.debug``;
    the master passes it on): what `gearbus status ID --debug` shows."""

    app_id: int


class Stimulus(Struct):
    """One event the AppMaster's state machine took."""

    stimulus_id: int  # in the order taken, from 1
    event: str
    age_s: float  # seconds before the reply was made
    detail: str  # its arguments
    decided: list[str] = dataclasses.field(default_factory=list)  # the kinds of the instructions it returned


class AppStimuli(Message):
    app_id: int
    phase: str  # the app's phase in its AppMaster (starting, deploying, running, rolling_back, ...)
    epoch: int
    stimuli: list[Stimulus] = dataclasses.field(default_factory=list)  # oldest first


class SavepointTaken(Message):
    app_id: int
    name: str
    checkpoint_id: int
    size_bytes: int
    steps: list[str] = dataclasses.field(default_factory=list)  # the stateful steps it holds


class RestartApplication(Message):
    """Submit an app again with its artifact, arguments and config (on ``app.restart``): a
    running app first takes a savepoint and stops, and the new one starts from it."""

    app_id: int


class ApplicationRestarted(Message):
    previous_app_id: int
    app_id: int  # the new app
    from_savepoint: str = ""  # "" when the previous app had ended: the new one starts afresh


class QueryLogs(Message):
    """Ask every worker (on ``logs.query``) for the output of an app's processes."""

    app_id: int
    executor_id: int | None = None  # None: every process of the app; -1: its AppMaster
    offsets: dict[str, int] = dataclasses.field(default_factory=dict)  # per log name: read from this byte
    max_bytes: int = 256 * 1024  # per reply, at most


class LogChunk(Struct):
    name: str  # "<worker>/app<app>-<kind><executor>": unique in the cluster
    executor_id: int
    kind: str
    offset: int  # the byte of the log where ``text`` starts
    text: str
    size: int  # the log's size now: offset + len(text in bytes) < size means more to read
    running: bool  # its process still runs


class LogsReply(Message):
    worker_id: str
    chunks: list[LogChunk] = dataclasses.field(default_factory=list)


class QueryApplication(Message):
    app_id: int


class ApplicationStatus(Message):
    app: AppSummary


class ListApplications(Message):
    include_finished: bool = True


class ApplicationList(Message):
    apps: list[AppSummary]


class QueryCluster(Message):
    pass


class ClusterInfo(Message):
    masters: list[str]
    leader: str
    workers: list[WorkerSummary]


class ApplicationStateChanged(Message):
    """Published by the master on ``app.<id>.state`` whenever an app changes state;
    also sent by an AppMaster to the master to report a terminal state."""

    app_id: int
    state: str
    error: AppError | None = None


# --- worker <-> master ----------------------------------------------------------


class RegisterWorker(Message):
    worker_id: str
    host: str
    pid: int
    slots: int
    protocol_version: int = PROTOCOL_VERSION
    running: list[RunningProcess] = dataclasses.field(default_factory=list)  # on re-registration


class WorkerLost(Message):
    """The master tells an AppMaster that a worker hosting its executors is gone."""

    worker_id: str
    reason: str = ""


class MasterElected(Message):
    """Published on ``master.elected`` by a master that has just taken the lead."""

    master_id: str
    term: int


class ReRegister(Message):
    """The leader does not know the receiver: it must register again."""

    reason: str = ""


class WorkerRegistered(Message):
    worker_id: str
    heartbeat_interval_s: float


class WorkerHeartbeat(Message):
    worker_id: str
    slots: int
    slots_used: int
    running: list[str] = dataclasses.field(default_factory=list)  # "<app>/<executor>"


class LaunchExecutor(Message):
    """Start an AppMaster (kind=appmaster, executor_id=-1) or an executor process."""

    app_id: int
    executor_id: int
    kind: str
    artifact: str
    entry: str
    artifact_kind: str = "module"
    args: list[str] = dataclasses.field(default_factory=list)
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    app_name: str = ""
    priority: int = 0  # the app's scheduling priority, for the AppMaster's resource requests
    attempt: int = 0  # AppMasters: 0 for the first, n for the n-th relaunch (it adopts the running executors)
    start_ms: int = 0  # when the app was submitted (epoch ms): the app's clock origin for every AppMaster
    worker_id: str = ""  # on master.app.<app>.executor.launch: the allocated worker to start it on
    artifact_digest: str = ""  # SHA-256 (hex) of the artifact at submission: a changed artifact is not run
    credentials: str = ""  # the app's own NATS credentials file (text), issued by the master; "" on an open cluster
    app_type: str = AppType.STREAMING  # which implementation the launched process runs (SubmitApplication's)
    workers: list[str] = dataclasses.field(default_factory=list)  # SubmitApplication's, for the AppMaster
    submitter_dir: str = ""  # SubmitApplication's: where the app's relative file paths are


class ExecutorLaunched(Message):
    worker_id: str
    pid: int


class ShutdownExecutor(Message):
    """Stop one executor of an app, or every process of the app when executor_id is None."""

    app_id: int
    executor_id: int | None = None
    reason: str = ""
    force: bool = False  # SIGKILL at once: the executor was declared lost (it may be hung or stopped)


class ExecutorStopped(Message):
    """A worker's report that a process it launched has exited; or an executor's own, as it
    exits because its worker died (``worker_gone``: nobody else would report it)."""

    worker_id: str
    app_id: int
    executor_id: int
    kind: str
    exit_code: int
    worker_gone: bool = False
    attempt: int = 0  # an AppMaster's: the attempt it was launched as (a report of a replaced one changes nothing)
    last_error: str = ""  # the last error line of the process's output (a worker's report of a failed exit)

    def exit_detail(self) -> str:
        """The exit as the reasons built on it say it: the code, and the last error line when the
        process left one."""
        return f"exited with code {self.exit_code}" + (f" (last error: {self.last_error})" if self.last_error else "")


# --- appmaster <-> master -------------------------------------------------------


class RegisterAppMaster(Message):
    app_id: int
    worker_id: str
    pid: int
    protocol_version: int = PROTOCOL_VERSION
    attempt: int = 0  # LaunchExecutor.attempt: an older attempt than the app's current one is refused (fenced)


class AppMasterRegistered(Message):
    app_id: int
    heartbeat_interval_s: float


class AppMasterHeartbeat(Message):
    app_id: int
    executors: int
    tasks: list[TaskCounters] = dataclasses.field(default_factory=list)
    clock: int | None = None  # the minimum watermark of the tasks that have not finished
    stalled_tasks: list[str] = dataclasses.field(default_factory=list)
    restarts: int = 0
    blacklisted_workers: list[str] = dataclasses.field(default_factory=list)
    guarantee: str = ""
    guarantee_detail: str = ""
    checkpoints: CheckpointStats | None = None
    dag: AppDag | None = None
    processors: list[ProcessorMetrics] = dataclasses.field(default_factory=list)
    attempt: int = 0  # the sender's LaunchExecutor.attempt
    versions: list[AppVersion] = dataclasses.field(default_factory=list)  # the app's code history
    events: list[AppEvent] = dataclasses.field(default_factory=list)  # its last ones, oldest first


class RequestResource(Message):
    """Ask for ``slots`` slots; with ``min_slots`` > 0 the master may grant fewer, not below it."""

    app_id: int
    slots: int
    min_slots: int = 0
    placement: str = Placement.ANY
    worker_id: str = ""  # with placement "worker"
    priority: int = 0
    exclude_workers: list[str] = dataclasses.field(default_factory=list)  # blacklisted for this app


class ResourceAllocated(Message):
    app_id: int
    allocations: list[Allocation]


# --- executor <-> appmaster -----------------------------------------------------


class RegisterExecutor(Message):
    app_id: int
    executor_id: int
    worker_id: str
    pid: int
    protocol_version: int = PROTOCOL_VERSION
    tasks: list[TaskId] = dataclasses.field(default_factory=list)  # when re-registering: the tasks it runs
    finished: list[TaskId] = dataclasses.field(default_factory=list)  # ... and those of them that have ended


class ExecutorRegistered(Message):
    app_id: int
    executor_id: int
    heartbeat_interval_s: float


class LaunchTasks(Message):
    """Run ``tasks`` in attempt ``epoch``; tasks of an older attempt on this executor stop
    first. ``restore_checkpoint``: the completed checkpoint to restore from (0: fresh)."""

    tasks: list[TaskId]
    dag_digest: str
    start_ms: int = 0  # when the app started (epoch ms): sources that follow the clock resume from it
    epoch: int = 0
    restore_checkpoint: int = 0
    restore_epoch: int = 0  # the epoch the restored checkpoint was taken in
    #: processor id -> its parallelism, where a rescale changed the plan's
    parallelism: dict[int, int] = dataclasses.field(default_factory=dict)
    #: processor id -> the parallelism its snapshots of restore_checkpoint were taken at, where not the
    #: parallelism it runs at now (a rescale): each task restores the key groups it owns from those
    restore_parallelism: dict[int, int] = dataclasses.field(default_factory=dict)
    #: processor id -> the version whose code it runs, where not the app as submitted (gearbus replace)
    versions: dict[int, AppVersion] = dataclasses.field(default_factory=dict)
    #: processor id -> steps whose state in restore_checkpoint its new code does not take over
    drop_state: dict[int, list[str]] = dataclasses.field(default_factory=dict)
    #: processor id -> an event time from which its tasks hold input records back for new code (replace --at)
    hold_from: dict[int, int] = dataclasses.field(default_factory=dict)
    #: tasks among ``tasks`` that run here, parked at restore_checkpoint (a rescale of other processors): they go
    #: on in place in this epoch, their channels rewired, not restored; the launch is refused if one is not so
    keep_running: list[TaskId] = dataclasses.field(default_factory=list)


class TaskRegistered(Message):
    executor_id: int
    tasks: list[TaskId]


class StartAllTasks(Message):
    pass


class ExecutorHeartbeat(Message):
    app_id: int
    executor_id: int
    tasks: list[TaskCounters]


class TaskFinished(Message):
    executor_id: int
    counters: TaskCounters
    epoch: int = 0


class TaskFailed(Message):
    executor_id: int
    task: TaskId
    error: AppError
    epoch: int = 0
    recoverable: bool = False  # error.kind == "fault", for peers that predate AppError.kind


class TaskEnded(Message):
    """Every input of the task ended and its end-of-stream went downstream; it waits for
    the final checkpoint before it finishes."""

    executor_id: int
    task: TaskId
    epoch: int


class TriggerCheckpoint(Message):
    """Broadcast to the app's executors: source tasks of ``epoch`` inject the barrier.
    ``park``: every task parks after its snapshot (the barrier says so downstream) until a
    launch of the next epoch keeps it running or replaces it (a rescale's checkpoint)."""

    checkpoint_id: int
    epoch: int
    park: bool = False


class TaskCheckpointed(Message):
    """A task stored its snapshot for a checkpoint (in the checkpoint object store)."""

    executor_id: int
    task: TaskId
    checkpoint_id: int
    epoch: int
    size_bytes: int
    ended: bool = False
    alignment_ms: int = 0  # from its first input's barrier to its last's
    root: int = 0  # the checkpoint whose whole snapshot its chain starts from (0: this one)
    depth: int = 0  # snapshots between this one and its root
    records_in: int = 0  # what the task processed in its epoch before the barrier


class CheckpointDeclined(Message):
    """A task could not store its snapshot for a checkpoint."""

    executor_id: int
    task: TaskId
    checkpoint_id: int
    epoch: int
    reason: str


class CheckpointComplete(Message):
    """Broadcast to the app's executors: every task acknowledged the checkpoint and its
    record is stored; tasks of ``epoch`` commit what they sealed up to it."""

    checkpoint_id: int
    epoch: int
    final: bool = False
    compacted: int = 0  # the last checkpoint whose snapshots the AppMaster compacted (0: none)
    compacting: int = 0  # this checkpoint when the AppMaster starts compacting it now (0: none)


# --- shell applications (gearbus shell) -------------------------------------------------


class ShellLine(Struct):
    """One line a shell command wrote, without its line end (a line longer than
    ``MAX_SHELL_LINE_CHARS`` is cut there, and ends with " [cut]")."""

    stream: str  # ShellStream: "stdout" or "stderr"
    text: str


#: The longest line a shell command's output keeps; what follows is cut.
MAX_SHELL_LINE_CHARS = 16 * 1024


class ShellLines(Message):
    """A shell app's executor sends the lines its command wrote, in order, to its AppMaster
    (request, answered Ack); ``seq`` counts its batches from 0, one in flight at a time, so
    a batch sent again is recognised and kept once."""

    app_id: int
    executor_id: int
    seq: int
    lines: list[ShellLine] = dataclasses.field(default_factory=list)


class ShellExited(Message):
    """A shell app's command ended (after its last ShellLines was answered): its exit code
    as a shell gives it (128 + N when signal N ended it; 127 when the command does not exist,
    126 when it cannot be run), and why, when it was stopped."""

    app_id: int
    executor_id: int
    exit_code: int
    reason: str = ""


class StopShellCommand(Message):
    """The AppMaster asks a shell app's executor to end its command (past ``--timeout``):
    SIGTERM to the command's process group, SIGKILL after a grace; the executor then sends
    ShellExited with ``reason``."""

    reason: str = ""


class ReadShellOutput(Message):
    """Read a shell app's output (on ``app.shell.output``; the master asks the app's
    AppMaster, or reads what it stored once the app ended): per worker, the lines from line
    ``offsets[worker]`` on (0 when absent). With ``wait_ms``, the answer waits that long for
    a line or an end when there is nothing new yet."""

    app_id: int
    offsets: dict[str, int] = dataclasses.field(default_factory=dict)
    wait_ms: int = 0
    max_bytes: int = 256 * 1024  # per answer, counted as SHELL_OUTPUT_BYTES (at least one line per worker with any)


class ShellWorkerOutput(Struct):
    """What one worker's command wrote (kept: the last ``SHELL_OUTPUT_BYTES`` of it) and how
    it ended. Lines are numbered from 0 over the command's whole output."""

    worker_id: str
    status: str  # "waiting" (for its slot), "starting", "running", "stopping", "exited", "lost"
    first_line: int  # the number of lines[0]: offset or, where the lines from offset on are no longer kept, the first kept
    lines: list[ShellLine] = dataclasses.field(default_factory=list)
    next_line: int = 0  # the offset to read on from
    total_lines: int = 0  # lines the command wrote so far
    dropped: int = 0  # lines of the asked range that are no longer kept (past the bound), before first_line
    exit_code: int | None = None  # once exited
    detail: str = ""  # why it was stopped, or lost


#: Output a shell app keeps per worker, in bytes of line text and SHELL_LINE_OVERHEAD per line (so that it is
#: stored in one value under a NATS server's default 1 MB payload); past it the oldest lines go.
SHELL_OUTPUT_BYTES = 512 * 1024
SHELL_LINE_OVERHEAD = 16


class ShellOutput(Message):
    """The answer to ReadShellOutput: each worker's new lines and state. ``ended``: the app
    ended and these are its last lines (read on from ``next_line`` finds nothing more)."""

    app_id: int
    state: str
    workers: list[ShellWorkerOutput] = dataclasses.field(default_factory=list)
    ended: bool = False
