"""Which task of a JetStream source reads which subject, and from where: decided by each
task alone, with no coordination at run time, so that every subject is read by exactly
one task, also when subjects appear while the app runs, after a rescale and after a
recovery.

A subject belongs to the task that owns its key group (:func:`gearbus.api.partitioners.key_owner`,
the one specified hash): any task that sees a subject knows whether it is its own. A task
reads all its subjects through one consumer, so its position is one stream sequence; a
subject read further than that (handed over by a rescale, or known before one that
appeared later) keeps its own read position in ``skip``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from gearbus.api.partitioners import key_owner


def subject_owner(subject: str, parallelism: int) -> int:
    """The index of the task of ``parallelism`` that reads ``subject``."""
    return key_owner(subject, parallelism)


def owned_subjects(subjects: Iterable[str], index: int, parallelism: int) -> list[str]:
    """The subjects of ``subjects`` that task ``index`` of ``parallelism`` reads, sorted."""
    return sorted(s for s in set(subjects) if subject_owner(s, parallelism) == index)


def read_to(position: int, subjects: Iterable[str], skip: Mapping[str, int]) -> dict[str, int]:
    """``{subject: the last sequence read on it}`` of a task at ``position`` with ``skip``."""
    return {subject: max(position, skip.get(subject, 0)) for subject in subjects}


def position_and_skip(read: Mapping[str, int], default: int) -> tuple[int, dict[str, int]]:
    """A task's position for subjects read up to ``read``: the lowest of them (``default``
    when it has none), and the others' positions where they are further on."""
    position = min(read.values(), default=default)
    return position, {subject: seq for subject, seq in read.items() if seq > position}
