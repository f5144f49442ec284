"""A kill while a submission is under way, without a network: the lifecycle machine alone,
and the master's shell with a fake bus and a fake KV bucket that lets each step of the
submission be held while the kill comes in."""

from __future__ import annotations

import asyncio

import msgpack
import nats.js.errors
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.master import master as master_module
from services.master.lifecycle import (AnswerSubmission, AppLifecycles, LaunchAppMaster, Phase, SetState,
                                       StopAppProcesses, Timeouts)
from services.master.master import Master
from services.master.store import StateStore
from shared import subjects
from shared.bus import RequestError
from shared.messages import AppState, ErrorCode, KillApplication, SubmitApplication

TIMEOUTS = Timeouts(register_s=60, heartbeat_s=10, reconfirm_s=5)


def machine() -> AppLifecycles:
    return AppLifecycles(TIMEOUTS)


# -- the machine ------------------------------------------------------------------------------

def test_a_kill_before_the_slot_is_asked_for_answers_the_submitter_and_launches_nothing():
    """The interleaving that made a killed app's submit succeed: the kill comes after the
    app is visible (PENDING) but before the master asks for its AppMaster's slot."""
    m = machine()
    m.accepted(1, 3)
    assert m.phase(1) is Phase.ACCEPTED and m.starting(1)
    m.validate()
    answer, state, stop = m.kill(1)
    assert answer == AnswerSubmission(1, "app 1 was killed while starting", "conflict")
    assert state == SetState(1, AppState.TERMINATED, None) and stop == StopAppProcesses(1, "killed by request")
    assert m.submitted(1, 3) == []  # its stores are made: no AppMaster for a killed app
    assert m.phase(1) is Phase.ENDED and not m.starting(1)
    with pytest.raises(KeyError):
        m.registered(1, 0, "w1", 1)
    m.validate()


def test_an_accepted_app_starts_once_submitted():
    m = machine()
    m.accepted(1, 3)
    assert m.submitted(1, 3) == [LaunchAppMaster(1, 0)] and m.phase(1) is Phase.LAUNCHING
    assert m.launched(1, 0, "w1", 0) == []
    assert m.registered(1, 0, "w1", 0) == [AnswerSubmission(1)]
    m.validate()


def test_an_accepted_app_whose_stores_cannot_be_made_fails_the_submission():
    m = machine()
    m.accepted(1, 3)
    answer, state, _ = m.launch_failed(1, 0, "its snapshot store could not be created")
    assert answer.code == "unavailable" and "snapshot store" in answer.error
    assert state.state == AppState.FAILED and state.error.error_type == "AppMasterLaunchFailed"
    assert m.submitted(1, 3) == [] and m.kill(1) == []
    m.validate()


def test_events_of_an_appmaster_not_yet_launched_change_nothing():
    m = machine()
    m.accepted(1, 3)
    assert m.launched(1, 0, "w1", 0) == [] and m.appmaster_exited(1, 0, "w1", "exited") == []
    assert m.worker_lost("w1", "gone") == [] and m.worker_registered("w1", []) == [] and m.tick(1e9) == []
    assert m.phase(1) is Phase.ACCEPTED
    m.validate()


steps = st.lists(st.sampled_from(["kill", "stores_made", "stores_failed", "launched", "registered", "state"]),
                 max_size=8)


@settings(max_examples=300, deadline=None)
@given(steps)
def test_a_kill_while_starting_wins_in_any_order(sequence):
    """Accepted, then the shell's steps and a kill in any order: a submitter answered at
    most once; killed while it waited, it learns so, and a killed app gets no launch."""
    m = machine()
    m.accepted(1, 3)
    answers, launches, killed_while_starting, ended = [], 0, False, False
    for step in sequence:
        if step == "kill":
            killed_while_starting = killed_while_starting or m.starting(1)
            out = m.kill(1)
        elif step == "stores_made":
            out = m.submitted(1, 3)
        elif step == "stores_failed":
            out = m.launch_failed(1, 0, "no store")
        elif step == "launched":
            out = m.launched(1, 0, "w1", 0)
        elif step == "registered":
            try:
                out = m.registered(1, 0, "w1", 0)
            except KeyError:
                out = []
        else:
            out = m.state_reported(1, AppState.SUCCEEDED)
        m.validate()
        for instruction in out:
            if isinstance(instruction, AnswerSubmission):
                answers.append(instruction)
            elif isinstance(instruction, LaunchAppMaster):
                assert not ended, "an ended app got an AppMaster"
                launches += 1
            elif isinstance(instruction, SetState):
                ended = True
    assert len(answers) <= 1 and launches <= 1
    if killed_while_starting:
        assert answers == [AnswerSubmission(1, "app 1 was killed while starting", "conflict")]


# -- the master's shell, with its awaits held open ----------------------------------------------

class FakeKV:
    """A KV bucket whose writes land at once but whose replies can be held, as a real one's
    do when the server is slow: a caller cancelled meanwhile never learns the revision."""

    def __init__(self):
        self.revisions: dict[str, int] = {}
        self.values: dict[str, bytes] = {}
        self.replies = asyncio.Event()
        self.replies.set()

    def _land(self, key: str, value: bytes) -> int:
        self.revisions[key] = max(self.revisions.values(), default=0) + 1
        self.values[key] = value
        return self.revisions[key]

    async def create(self, key, value):
        if key in self.revisions:
            raise nats.js.errors.KeyWrongLastSequenceError(description="wrong last sequence")
        revision = self._land(key, value)
        await self.replies.wait()
        return revision

    async def update(self, key, value, last):
        if self.revisions.get(key) != last:
            raise nats.js.errors.KeyWrongLastSequenceError(description="wrong last sequence")
        revision = self._land(key, value)
        await self.replies.wait()
        return revision

    def state(self, app_id: int) -> str:
        return msgpack.unpackb(self.values[subjects.app_state_key(app_id)])["state"]


class FakeLease:
    def valid(self) -> bool:
        return True


class FakeArtifacts:
    async def get_info(self, name):
        class Info:
            digest = None
        return Info()


class FakeJetStream:
    def __init__(self):
        self.snapshot_store_made = asyncio.Event()  # creating an app's snapshot store: slow under load

    async def object_store(self, bucket):
        if bucket == subjects.ARTIFACT_BUCKET:
            return FakeArtifacts()
        await self.snapshot_store_made.wait()
        return object()


class FakeBus:
    replicas = 1

    def __init__(self):
        self.js = FakeJetStream()
        self.published = []

    async def publish(self, subject, message):
        self.published.append((subject, message))

    async def request(self, subject, message, **kwargs):
        raise AssertionError(f"no request expected here: {subject}")


def make_master() -> tuple[Master, FakeBus, FakeKV]:
    master = Master("nats://unused:4222", "master-0")
    bus, kv = FakeBus(), FakeKV()
    master.bus = bus
    master.store = StateStore(None, kv, FakeLease())
    next_id = iter(range(1, 100))

    async def next_app_id():
        return next(next_id)

    master.store.next_app_id = next_app_id
    return master, bus, kv


async def visible(master: Master, app_id: int) -> None:
    async with asyncio.timeout(5):
        while app_id not in master.apps:
            await asyncio.sleep(0)


SUBMISSION = SubmitApplication("endless", "endless.py", "endless")


async def test_a_kill_while_the_snapshot_store_is_made_answers_the_submitter_conflict():
    """The integration test's interleaving: the app is PENDING in app.list, the kill comes
    while the master still creates the app's snapshot store, a slot frees after."""
    master, bus, kv = make_master()
    submitting = asyncio.create_task(master.on_submit(SUBMISSION))
    await visible(master, 1)
    assert master.apps[1].state == AppState.PENDING
    await master.on_kill(KillApplication(1))
    assert master.apps[1].state == AppState.TERMINATED and kv.state(1) == AppState.TERMINATED
    bus.js.snapshot_store_made.set()
    with pytest.raises(RequestError) as killed:
        async with asyncio.timeout(5):
            await submitting
    assert killed.value.code == ErrorCode.CONFLICT and not killed.value.retryable
    assert killed.value.message == "app 1 was killed while starting"
    assert not master._launching and not master.scheduler._waiting  # no AppMaster asked for
    master.scheduler.add_worker("w1", 1)  # the slot comes: nobody takes it
    master._reschedule()
    assert master.scheduler.usage("w1") == (1, 0)


async def test_a_kill_while_the_launch_records_its_attempt_is_carried_out():
    """The kill cancels the launch while the KV write of its attempt is under way (landed,
    not yet answered): the kill's own write must still succeed."""
    master, bus, kv = make_master()
    bus.js.snapshot_store_made.set()
    submitting = asyncio.create_task(master.on_submit(SUBMISSION))
    await visible(master, 1)
    kv.replies.clear()  # the launch's write lands, its reply is held
    key = subjects.app_state_key(1)
    first = kv.revisions[key]
    async with asyncio.timeout(5):
        while kv.revisions[key] == first:
            await asyncio.sleep(0)
    killing = asyncio.create_task(master.on_kill(KillApplication(1)))
    await asyncio.sleep(0.01)
    kv.replies.set()
    async with asyncio.timeout(5):
        await killing  # raised LeaseLost ("changed by another master") before
    assert kv.state(1) == AppState.TERMINATED
    with pytest.raises(RequestError) as killed:
        async with asyncio.timeout(5):
            await submitting
    assert killed.value.code == ErrorCode.CONFLICT
