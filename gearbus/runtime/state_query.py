"""Reading a running app's keyed state for one key (``gearbus state ID STEP KEY``): the
rules the AppMaster and the executors share. Keys come as JSON (arrays are tuples, as key
functions make them); the task that owns a key is the one its hash edge sends it to; a
step's value goes back as JSON, anything JSON cannot hold as its ``repr``."""

from __future__ import annotations

import json
import math
from typing import Any

from gearbus.api.graph import Processor
from gearbus.api.partitioners import key_owner
from gearbus.runtime.chain import ChainTask, Op
from shared.messages import StateValue


class StateQueryError(ValueError):
    """The query cannot be answered as asked: the message says what is wrong."""


def parse_key(text: str) -> Any:
    """A key given as JSON: ``"word"``, ``42``, ``[3, "a"]`` (a tuple), ``null``."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StateQueryError(f"the key must be JSON ({exc}): a string key is quoted, e.g. '\"word\"'") from None
    return _hashable(value)


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        raise StateQueryError("a key cannot be a JSON object: keys are strings, numbers, null or arrays (tuples)")
    return value


def as_json(value: Any) -> str:
    """``value`` as JSON text: tuples and sets as arrays, dict keys that are not strings as
    their JSON, non-finite floats and other objects as their ``repr``."""
    return json.dumps(_plain(value), ensure_ascii=False)


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = sorted(value, key=repr) if isinstance(value, (set, frozenset)) else value
        return [_plain(v) for v in items]
    if isinstance(value, dict):
        return {k if isinstance(k, str) else json.dumps(_plain(k)): _plain(v) for k, v in value.items()}
    return repr(value)


def keyed_op(processor: Processor, step: str) -> Op | None:
    """The op of ``step`` in ``processor``'s chain (None when the processor has no such step)."""
    if not issubclass(processor.task_class, ChainTask):
        return None
    return next((op for op in processor.config.get("ops", ()) if op.step == step), None)


def locate(processors: list[Processor], step: str, key: Any) -> tuple[Processor, int]:
    """The processor holding ``step`` and the index of its task that owns ``key``."""
    for processor in processors:
        op = keyed_op(processor, step)
        if op is None:
            continue
        if not op.keyed_state:
            raise StateQueryError(f"step {step!r} holds no state by key that can be read "
                                  f"({type(op).__name__}); the readable steps: {', '.join(readable(processors)) or 'none'}")
        return processor, key_owner(key, processor.parallelism)
    raise StateQueryError(f"no step named {step!r}; the steps holding state by key: "
                          f"{', '.join(readable(processors)) or 'none'}")


def readable(processors: list[Processor]) -> list[str]:
    """The steps whose state by key a query can read."""
    return [op.step for p in processors if issubclass(p.task_class, ChainTask)
            for op in p.config.get("ops", ()) if op.keyed_state]


def read(ops: list[Op], step: str, key: Any) -> tuple[bool, Any]:
    """(whether the task's ``step`` holds ``key``, its value) from a running task's ops."""
    for op in ops:
        if op.step == step:
            if not op.keyed_state:
                raise StateQueryError(f"step {step!r} holds no state by key that can be read")
            return op.state_of(key)
    raise StateQueryError(f"this task has no step {step!r}")


def answer(reply: StateValue) -> dict[str, Any]:
    """A reply as one JSON object (``gearbus state --json``, the REST API): key and value parsed."""
    return {"app_id": reply.app_id, "step": reply.step, "key": json.loads(reply.key),
            "task": {"processor": reply.task.processor, "index": reply.task.index}, "found": reply.found,
            "value": json.loads(reply.value)}
