"""A JetStream source's subjects and read positions: every subject belongs to exactly one
task by its hash, whichever subjects a task has seen, and a rescale hands each subject to
its new task, which reads it on from where its old task was."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gearbus.api.partitioners import key_owner
from gearbus.api.task import NotRescalable
from gearbus.connectors.jetstream_source import JetStreamSource
from gearbus.connectors.jetstream_subjects import owned_subjects, position_and_skip, read_to, subject_owner

SUBJECTS = [f"ev.{n}" for n in range(7)]

subject_names = st.lists(st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12),
                         max_size=40)


@given(subject_names, st.integers(1, 16))
def test_each_subject_belongs_to_exactly_one_task(subjects, parallelism):
    shares = [owned_subjects(subjects, index, parallelism) for index in range(parallelism)]
    assert sorted(s for share in shares for s in share) == sorted(set(subjects))
    assert all(subject_owner(s, parallelism) == key_owner(s, parallelism) for s in subjects)  # the one hash


@given(subject_names, subject_names, st.integers(1, 16), st.data())
def test_a_task_decides_alone_whatever_subjects_it_has_seen(seen, appeared, parallelism, data):
    """Two tasks that saw different sets of subjects (one opened before some appeared) never
    both take one: a subject's owner does not depend on which others exist."""
    index = data.draw(st.integers(0, parallelism - 1))
    early = owned_subjects(seen, index, parallelism)
    late = owned_subjects(seen + appeared, index, parallelism)
    assert set(early) <= set(late)
    others = {s for i in range(parallelism) if i != index for s in owned_subjects(seen + appeared, i, parallelism)}
    assert not others & set(early)


@given(st.dictionaries(st.sampled_from(SUBJECTS), st.integers(0, 1000), min_size=1), st.integers(0, 1000))
def test_a_position_and_its_skips_say_how_far_each_subject_was_read(read, default):
    position, skip = position_and_skip(read, default)
    assert position == min(read.values())
    assert read_to(position, read, skip) == read
    assert position_and_skip({}, default) == (default, {})


def old_states(positions: dict[str, int], parallelism: int, until=None, base=0) -> list[dict]:
    """Each old task's state: its subjects, the lowest of their positions as its own, and
    the rest as subjects to skip up to."""
    states = []
    for index in range(parallelism):
        owned = owned_subjects(positions, index, parallelism)
        seq, skip = position_and_skip({s: positions[s] for s in owned}, 0)
        states.append({"seq": seq, "until": until, "subjects": owned, "max_ts": {s: positions[s] * 10 for s in owned},
                       "skip": skip, "base": base})
    return states


@given(st.lists(st.integers(0, 1000), min_size=len(SUBJECTS), max_size=len(SUBJECTS)),
       st.integers(1, 5), st.integers(1, 9))
def test_each_subject_goes_to_one_new_task_and_is_read_on_from_where_it_was(seqs, old, new):
    positions = dict(zip(SUBJECTS, seqs))
    source = JetStreamSource("EV")
    states = [source.rescale(old_states(positions, old), index, new) for index in range(new)]
    owned = [s for state in states if state for s in state["subjects"]]
    assert sorted(owned) == SUBJECTS  # each once
    assert {s: seq for state in states for s, seq in read_to(state["seq"], state["subjects"], state["skip"]).items()} \
        == positions
    assert all(state["max_ts"] == {s: positions[s] * 10 for s in state["subjects"]} for state in states)
    assert all(state["subjects"] == owned_subjects(SUBJECTS, index, new) for index, state in enumerate(states))


def test_a_rescaled_task_reads_subjects_that_appear_from_the_earliest_start():
    states = old_states(dict.fromkeys(SUBJECTS, 5), 2, base=3)
    states[1]["base"] = 4  # start="new": each task took the stream's end when it opened
    assert {JetStreamSource("EV").rescale(states, index, 3)["base"] for index in range(3)} == {3}
    states[1].pop("base")  # a checkpoint from before subjects were assigned by hash: none looked for
    assert JetStreamSource("EV").rescale(states, 0, 3)["base"] is None


def test_tasks_that_end_at_different_sequences_cannot_be_rescaled():
    states = old_states(dict.fromkeys(SUBJECTS, 5), 2, until=40)
    states[1]["until"] = 41
    with pytest.raises(NotRescalable, match=r"end at different stream sequences \(\[40, 41\]"):
        JetStreamSource("EV").rescale(states, 0, 3)
    assert JetStreamSource("EV").rescale([None, None], 0, 3) is None
