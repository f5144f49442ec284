"""The events file schema: one JSON object per line, as the nexmark repository's Flink DDL
declares it, with ``dateTime`` and ``expires`` in epoch milliseconds::

    {"event_type": 0|1|2, "person": {...}|null, "auction": {...}|null, "bid": {...}|null}

``event_type`` 0 is a person, 1 an auction, 2 a bid; exactly that one of the three is an
object and the others are null. Inner objects hold exactly the SQL columns below.
"""

from __future__ import annotations

from gearbus.nexmark.generator import AUCTION, BID, EVENT_TYPES, KINDS, PERSON

#: Each kind's columns and their JSON types, in the DDL's order.
COLUMNS: dict[str, dict[str, type]] = {
    PERSON: {"id": int, "name": str, "emailAddress": str, "creditCard": str, "city": str, "state": str,
             "dateTime": int, "extra": str},
    AUCTION: {"id": int, "itemName": str, "description": str, "initialBid": int, "reserve": int, "dateTime": int,
              "expires": int, "seller": int, "category": int, "extra": str},
    BID: {"auction": int, "bidder": int, "price": int, "channel": str, "url": str, "dateTime": int, "extra": str},
}
ENVELOPE = ("event_type",) + KINDS
_KIND_OF = {code: kind for kind, code in EVENT_TYPES.items()}
_ENVELOPE_KEYS = frozenset(ENVELOPE)
_KEYS = {kind: frozenset(columns) for kind, columns in COLUMNS.items()}


def problem(event) -> str | None:
    """What is wrong with ``event`` as a Nexmark event, or None when it fits the schema."""
    if not isinstance(event, dict):
        return f"expected a JSON object, got {type(event).__name__}"
    if event.keys() != _ENVELOPE_KEYS:
        return _keys_problem("the event", event.keys(), _ENVELOPE_KEYS)
    code = event["event_type"]
    kind = _KIND_OF.get(code) if type(code) is int else None
    if kind is None:
        return f"event_type must be 0 (person), 1 (auction) or 2 (bid), got {code!r}"
    for other in KINDS:
        if other != kind and event[other] is not None:
            return f"event_type {code} is a {kind}, but {other!r} is not null"
    inner = event[kind]
    if not isinstance(inner, dict):
        return f"event_type {code} needs {kind!r} to be an object, got {inner!r}"
    if inner.keys() != _KEYS[kind]:
        return _keys_problem(f"the {kind}", inner.keys(), _KEYS[kind])
    for column, expected in COLUMNS[kind].items():
        value = inner[column]
        if type(value) is not expected:
            wanted = "an integer" if expected is int else "a string"
            return f"{kind}.{column} must be {wanted}, got {value!r}"
    return None


def _keys_problem(what: str, keys, expected: frozenset) -> str:
    missing, unknown = sorted(expected - keys), sorted(set(keys) - expected)
    parts = ([f"missing {', '.join(missing)}"] if missing else []) + ([f"unknown {', '.join(unknown)}"]
                                                                       if unknown else [])
    return f"{what} has {'; '.join(parts)} (expected keys: {', '.join(sorted(expected))})"


def kind_of(event: dict) -> str:
    """The kind of a valid event."""
    return _KIND_OF[event["event_type"]]


def schema_error(path: str, line_number: int, what: str, line: str) -> ValueError:
    """The error for line ``line_number`` of events file ``path``."""
    return ValueError(f"{path}:{line_number}: not a Nexmark event: {what}: {line[:200]!r}")
