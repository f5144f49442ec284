"""A JetStream source's read positions divided over another number of tasks: every subject
goes to exactly one new task, which reads it on from where its old task was."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gearbus.api.task import NotRescalable
from gearbus.connectors.jetstream_source import JetStreamSource

SUBJECTS = [f"ev.{n}" for n in range(7)]


def old_states(positions: dict[str, int], parallelism: int, until=None) -> list[dict]:
    """Each old task's state: its subjects (i, i + N, ...), the lowest of their positions as
    its own, and the rest as subjects to skip up to."""
    states = []
    for index in range(parallelism):
        owned = sorted(positions)[index::parallelism]
        seq = min((positions[s] for s in owned), default=0)
        states.append({"seq": seq, "until": until, "subjects": owned, "max_ts": {s: positions[s] * 10 for s in owned},
                       "skip": {s: positions[s] for s in owned if positions[s] > seq}})
    return states


def read_to(state: dict) -> dict[str, int]:
    return {s: max(state["seq"], state["skip"].get(s, 0)) for s in state["subjects"]}


@given(st.lists(st.integers(0, 1000), min_size=len(SUBJECTS), max_size=len(SUBJECTS)),
       st.integers(1, 5), st.integers(1, 9))
def test_each_subject_goes_to_one_new_task_and_is_read_on_from_where_it_was(seqs, old, new):
    positions = dict(zip(SUBJECTS, seqs))
    source = JetStreamSource("EV")
    states = [source.rescale(old_states(positions, old), index, new) for index in range(new)]
    owned = [s for state in states for s in state["subjects"]]
    assert sorted(owned) == SUBJECTS  # each once
    assert {s: seq for state in states for s, seq in read_to(state).items()} == positions
    assert all(state["max_ts"] == {s: positions[s] * 10 for s in state["subjects"]} for state in states)
    assert all(state["subjects"] == SUBJECTS[index::new] for index, state in enumerate(states))


def test_tasks_that_end_at_different_sequences_cannot_be_rescaled():
    states = old_states(dict.fromkeys(SUBJECTS, 5), 2, until=40)
    states[1]["until"] = 41
    with pytest.raises(NotRescalable, match=r"end at different stream sequences \(\[40, 41\]"):
        JetStreamSource("EV").rescale(states, 0, 3)
    assert JetStreamSource("EV").rescale([None, None], 0, 3) is None
