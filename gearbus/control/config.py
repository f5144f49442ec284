"""The application config: one typed description of every key an app's config may hold
(its default, what it may be, one line on what it does), parsed in one place.

The client parses it when it plans the app, the master when an app is submitted (from any
NATS client), and the AppMaster and executors when they start it: so a mistake is refused
before an app id exists, with the key, the value and what is allowed, and every runner and
role reads the same values. docs/operations.md lists the user's keys with these defaults
(tests/unit/test_app_config.py keeps it so)."""

from __future__ import annotations

import dataclasses
import difflib
import math
import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gearbus.api.graph import GraphError
from gearbus.api.partitioners import MAX_PARALLELISM
from shared.messages import Placement

#: The backends an app may name in ``config={"state_backend": ...}`` (gearbus/runtime/state_backend.py).
BACKENDS = ("memory", "rocksdb")
#: The cluster's default when an app names none (set it on the workers' processes).
BACKEND_ENV = "GEARBUS_STATE_BACKEND"
#: What a savepoint may be named (`gearbus savepoint --name`, config from_savepoint).
SAVEPOINT_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
SAVEPOINT_NAME_RULE = "1-64 letters, digits, '-' or '_'"

#: The debloat target by state backend, when the app sets none. State on disk makes a task
#: slow, and a fixed window then queues seconds of records before each barrier: at
#: 10,000,000 keys, checkpoint p50 / p99 1.53 / 2.53 s with a fixed window, 0.52 / 0.78 s
#: debloated to 100 ms, at the same events/s. In memory a fixed window queues about half
#: a second, and debloating cost throughput (a tenth at 10,000,000 keys, 7 % on Nexmark
#: q5): off. Measured with bench/state.py.
DEBLOAT_TARGET_MS = {"memory": 0, "rocksdb": 100}


class ConfigError(GraphError):
    """An application config that cannot run (so the app cannot, as a bad graph cannot);
    the message names the key, the value and what is allowed."""


@dataclass(frozen=True)
class Rule:
    """What a key's value may be: ``test`` says whether it is, ``allowed`` says it to the user."""

    test: Callable[[Any], bool]
    allowed: str


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def integer(low: int, high: int | None = None) -> Rule:
    """An int (not a bool) from ``low`` (to ``high``)."""
    allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
    return Rule(lambda v: _is_int(v) and low <= v and (high is None or v <= high), allowed)


def number(positive: bool = False) -> Rule:
    """A finite int or float, not negative (``positive``: above 0)."""
    return Rule(lambda v: (_is_int(v) or isinstance(v, float)) and (0 < v if positive else 0 <= v) and v < math.inf,
                "a positive number" if positive else "a non-negative number")


def choice(*options: str, allowed: str = "") -> Rule:
    return Rule(lambda v: v in options, allowed or f"one of {', '.join(options)}")


BOOLEAN = Rule(lambda v: isinstance(v, bool), "true or false")
TEXT = Rule(lambda v: isinstance(v, str), "a string")
UNBOUNDED_OR_BYTES = Rule(lambda v: _is_int(v) and (v == -1 or v >= 1), "-1 (unbounded) or an integer >= 1")


def key(default, rule: Rule, doc: str, shown: str | None = None, internal: bool = False):
    """A config key: ``doc`` says what it does; ``shown``: the default as docs/operations.md
    says it, where it is not the value itself; ``internal``: set by gearbus, not the user."""
    return field(default=default, metadata={"rule": rule, "doc": doc, "shown": shown, "internal": internal})


@dataclass(frozen=True)
class AppConfig:
    """Every key of an application's config; None: decided where the app runs."""

    executors: int = key(2, integer(1), "executor processes to request")
    task_placement: str = key("by_index", choice("by_index", "round_robin"),
                              "by_index: task i of every processor in one executor; round_robin spreads them")
    max_restarts: int = key(10, integer(0), "rollbacks the app survives; then it fails with the last error")
    blacklist_after: int = key(3, integer(1), "faults on one worker (never user errors) before the app stops using it")
    appmaster_restarts: int = key(3, integer(0), "AppMaster relaunches before the app fails")
    appmaster_timeout_s: float = key(30.0, number(positive=True),
                                     "an executor whose AppMaster stays silent this long stops")
    stall_timeout_s: float = key(30.0, number(positive=True),
                                 "a task whose watermark stands still this long while records arrive is stalled")
    batch_records: int = key(4096, integer(1), "records per frame at most, and per source read")
    batch_bytes: int = key(512 * 1024, integer(1), "encoded bytes per frame at most (a lone larger record still goes)")
    linger_ms: float = key(0.0, number(), "how long a task whose inbox ran dry holds a small batch")
    credit_frames: int = key(16, integer(2), "frames in flight per sender -> receiver pair, at most")
    debloat_target_ms: float | None = key(
        None, number(), "a receiver grants the frames it processes in this long (0: always credit_frames)",
        shown="100 with `state_backend: rocksdb`, else 0")
    task_metrics: bool = key(True, BOOLEAN, "time every batch a task processes (latency histogram, busy share)")
    combine_keys: int = key(100_000, integer(1), "keys a map-side combine holds before sending partial aggregates")
    checkpoint_interval_ms: int = key(1000, integer(0), "how often to checkpoint; 0: only a bounded app's last")
    incremental_checkpoints: bool = key(True, BOOLEAN, "keyed state snapshots hold the keys changed since the last")
    local_copies: bool = key(True, BOOLEAN, "state on disk keeps a local copy of each checkpoint to restore from")
    checkpoint_timeout_ms: int = key(60_000, integer(1), "a checkpoint not complete by then is abandoned")
    checkpoints_kept: int = key(3, integer(1), "completed checkpoints kept in the object store")
    checkpoint_failures_tolerated: int = key(10, integer(0), "consecutive failed checkpoints before the app fails")
    intermediate_streams: str = key("none", choice("none", "all", allowed="'all' or 'none'"),
                                    "all: every shuffle goes through an intermediate stream (the app runs in stages)")
    intermediate_stream_partitions: int | None = key(
        None, integer(1, MAX_PARALLELISM), "partitions of each intermediate stream not given repartition(partitions=)",
        shown="the larger parallelism on the stream's two sides")
    intermediate_stream_max_bytes: int = key(-1, UNBOUNDED_OR_BYTES, "what each intermediate stream may hold",
                                             shown="-1 (unbounded)")
    state_backend: str | None = key(None, choice(*BACKENDS), "where keyed state lives",
                                    shown=f"the cluster's (`{BACKEND_ENV}`, else `memory`)")
    placement: str = key(Placement.ANY, choice(*sorted(Placement.ALL)),
                         "where the executors' slots go: any worker, one worker, or the worker named by worker_id")
    worker_id: str = key("", TEXT, "the worker of placement: worker")
    timeout_s: float = key(0.0, number(), "a shell app's command is stopped after this long (0: never)")
    stage: int | None = key(None, integer(0), "the stage of a multi-stage app this app runs", internal=True)
    from_savepoint: str = key("", Rule(lambda v: v == "" or isinstance(v, str) and bool(SAVEPOINT_NAME.fullmatch(v)),
                                       f"a savepoint name ({SAVEPOINT_NAME_RULE})"),
                              "the savepoint the app starts from (gearbus submit --from-savepoint)", internal=True)
    allow_unclaimed_state: bool = key(False, BOOLEAN, "start although the savepoint holds state no step takes",
                                      internal=True)

    @classmethod
    def parse(cls, config: Mapping, strict: bool = True) -> AppConfig:
        """``config`` checked key by key: ConfigError for an unknown key (naming the nearest
        known one), a value of the wrong type or out of range, or keys that contradict.
        ``strict=False`` leaves unknown keys out (a plug-in application type's own)."""
        if not isinstance(config, Mapping):
            raise ConfigError(f"application config must be a mapping of keys to values, got {type(config).__name__}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        if not strict:
            config = {name: value for name, value in config.items() if name in fields}
        for name, value in config.items():
            if name not in fields:
                raise ConfigError(_unknown(name, fields))
            rule = fields[name].metadata["rule"]
            if not (value is None and fields[name].default is None) and not rule.test(value):
                raise ConfigError(f"application config {name} must be {rule.allowed}, got {value!r}")
        made = cls(**config)
        if made.placement == Placement.WORKER and not made.worker_id:
            raise ConfigError(f"application config placement {Placement.WORKER!r} needs worker_id, the worker to use")
        return made

    def resolved(self) -> AppConfig:
        """As it applies where the app runs: the state backend it names, else this host's
        default (:data:`BACKEND_ENV`, else memory); the debloat target of that backend
        unless it sets one."""
        backend = self.state_backend or default_backend()
        debloat = DEBLOAT_TARGET_MS[backend] if self.debloat_target_ms is None else self.debloat_target_ms
        return dataclasses.replace(self, state_backend=backend, debloat_target_ms=debloat)


def default_backend() -> str:
    """This host's default state backend; ConfigError naming the choices for a bad one."""
    name = os.environ.get(BACKEND_ENV) or "memory"
    if name not in BACKENDS:
        raise ConfigError(f"{BACKEND_ENV} must be one of {', '.join(BACKENDS)}, got {name!r}")
    return name


def _unknown(name, fields: Mapping[str, dataclasses.Field]) -> str:
    near = difflib.get_close_matches(str(name), list(fields), n=1)
    hint = f"did you mean {near[0]!r}?" if near else f"the keys are {', '.join(fields)}"
    return f"unknown application config key {name!r}: {hint}"


def documented_default(f: dataclasses.Field) -> str:
    """A key's default as the table in docs/operations.md says it."""
    if f.metadata["shown"] is not None:
        return f.metadata["shown"]
    value = f.default
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, str):
        return f"`{value}`" if value else "\"\""
    return str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)


def user_keys() -> list[dataclasses.Field]:
    """The keys a user sets, in the order of the docs' table."""
    return [f for f in dataclasses.fields(AppConfig) if not f.metadata["internal"]]


def internal_keys() -> list[str]:
    """The keys gearbus sets itself (known, so a config that holds them parses)."""
    return [f.name for f in dataclasses.fields(AppConfig) if f.metadata["internal"]]
