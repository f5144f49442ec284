"""The command line's argument types: each refuses a value that cannot work (argparse then
exits 2 saying which argument and why), so a mistake is reported before anything is sent."""

from __future__ import annotations

import argparse

from gearbus.api.partitioners import MAX_PARALLELISM
from gearbus.control.config import SAVEPOINT_NAME, SAVEPOINT_NAME_RULE
from shared.bus import positive_seconds


def _integer(text: str, low: int, high: int | None = None) -> int:
    try:
        value = int(text)
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        allowed = f"an integer >= {low}" if high is None else f"an integer from {low} to {high}"
        raise argparse.ArgumentTypeError(f"must be {allowed}, got {text!r}")
    return value


def count(text: str) -> int:
    """How many (workers, slots): at least 1."""
    return _integer(text, 1)


def app_id(text: str) -> int:
    """An application id: they start at 1."""
    return _integer(text, 1)


def event_time_ms(text: str) -> int:
    """An event time in epoch milliseconds."""
    return _integer(text, 0)


def port(text: str) -> int:
    """A TCP port (0: any free one)."""
    return _integer(text, 0, 65535)


#: A duration: a positive, finite number of seconds (the roles' --connect-timeout is checked alike).
seconds = positive_seconds


def step_parallelism(text: str) -> tuple[str, int]:
    """``STEP=N``: a step and the parallelism its processor may run at (1 to the key groups)."""
    step, sep, n = text.rpartition("=")
    if not sep or not step or not n.strip().lstrip("-").isdigit():
        raise argparse.ArgumentTypeError(f"{text!r}: write STEP=N, e.g. count=4")
    if not 1 <= int(n) <= MAX_PARALLELISM:
        raise argparse.ArgumentTypeError(f"{text!r}: a parallelism is from 1 to {MAX_PARALLELISM} (the key groups)")
    return step, int(n)


def savepoint_name(text: str) -> str:
    """A savepoint's name, as the AppMaster takes one ("": the default, made for it)."""
    if text and not SAVEPOINT_NAME.fullmatch(text):
        raise argparse.ArgumentTypeError(f"{text!r}: a savepoint name is {SAVEPOINT_NAME_RULE}")
    return text
