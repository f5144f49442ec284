"""The wire protocol as docs/protocol.md describes it, spoken with nothing but nats-py
and msgpack: what a client written in another language would do.

Deliberately does not import gearbus.client, gearbus.cli or shared.bus. Subjects and
message names are written out as literals, as a raw client would write them.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import hashlib
import inspect
import json
import os
import random
import re
import types
import typing

import msgpack
import nats
import pytest
import pytest_asyncio
from nats.js.errors import BucketNotFoundError

from tests.support.paths import REPO, WORDCOUNT
from tests.support.wordcount import read_counts

DOC = os.path.join(REPO, "docs", "protocol.md")
ARTIFACT_BUCKET = "gearbus_artifacts"
TERMINAL = {"SUCCEEDED", "FAILED", "TERMINATED"}

#: A test application that runs until killed: a source that never has data.
ENDLESS_APP = '''
from gearbus import Application, DataSource, Graph, Processor, Task


class Idle(DataSource):
    def read(self, max_records):
        return []


class Discard(Task):
    def on_next(self, record):
        pass


def application(args):
    graph = Graph()
    graph.connect(Processor.source(Idle(), name="idle"), Processor(Discard, name="discard"))
    return Application("endless", graph, config={"executors": 1})
'''


# --- a raw client: msgpack maps over NATS request/reply -----------------------------


def pack(type_: str, **fields) -> bytes:
    return msgpack.packb({"type": type_, "v": 1, **fields}, use_bin_type=True)


def unpack(data: bytes) -> dict:
    message = msgpack.unpackb(data, raw=False)
    assert isinstance(message, dict), f"expected a msgpack map, got {message!r}"
    assert message.get("v") == 1, f"reply without protocol version 1: {message!r}"
    return message


async def request(nc, subject: str, payload: bytes, timeout: float = 10.0) -> dict:
    return unpack((await nc.request(subject, payload, timeout=timeout)).data)


async def call(nc, subject: str, type_: str, expect: str, timeout: float = 10.0, **fields) -> dict:
    """Send one request and insist on a reply of type ``expect``."""
    reply = await request(nc, subject, pack(type_, **fields), timeout)
    assert reply["type"] == expect, f"{subject} {type_}{fields}: expected {expect}, got {reply!r}"
    return reply


async def refused(nc, subject: str, payload: bytes, code: str) -> str:
    """Send a request that must fail with ErrorReply ``code``; return its message."""
    reply = await request(nc, subject, payload)
    assert reply["type"] == "ErrorReply", f"{subject}: expected an ErrorReply, got {reply!r}"
    assert reply["code"] == code, f"{subject}: expected code {code!r}, got {reply!r}"
    assert isinstance(reply["message"], str) and reply["message"], reply
    assert isinstance(reply["retryable"], bool), reply
    return reply["message"]


async def upload(nc, data: bytes, entry: str) -> str:
    """Put an artifact in the object store under a content-addressed name."""
    js = nc.jetstream()
    try:
        store = await js.object_store(ARTIFACT_BUCKET)
    except BucketNotFoundError:
        store = await js.create_object_store(ARTIFACT_BUCKET)
    name = f"{entry}-{hashlib.sha256(data).hexdigest()[:32]}.py"
    await store.put(name, data)
    return name


async def submit(nc, artifact: str, entry: str, args: list[str], name: str = "") -> int:
    reply = await call(nc, "app.submit", "SubmitApplication", "SubmitApplicationResult", timeout=90,
                       name=name or entry, artifact=artifact, entry=entry, artifact_kind="module", args=args,
                       user="raw-client")
    assert isinstance(reply["app_id"], int) and reply["app_id"] >= 1, reply
    return reply["app_id"]


async def status(nc, app_id: int) -> dict:
    return (await call(nc, "app.status", "QueryApplication", "ApplicationStatus", app_id=app_id))["app"]


async def list_apps(nc, **fields) -> list[dict]:
    return (await call(nc, "app.list", "ListApplications", "ApplicationList", **fields))["apps"]


async def wait_for_state(nc, cluster, app_id: int, wanted: set[str], timeout: float = 60.0) -> dict:
    """Follow ``app.<id>.state``: subscribe, then ask app.status, then wait for events.

    Returns the app's summary once its state is one of ``wanted``.
    """
    events: asyncio.Queue[dict] = asyncio.Queue()

    async def on_event(msg):
        events.put_nowait(unpack(msg.data))

    sub = await nc.subscribe(f"app.{app_id}.state", cb=on_event)
    try:
        app = await status(nc, app_id)
        async with asyncio.timeout(timeout):
            while app["state"] not in wanted:
                assert app["state"] not in TERMINAL, f"app {app_id} ended {app['state']}, wanted {wanted}: {app}"
                event = await events.get()
                assert event["type"] == "ApplicationStateChanged" and event["app_id"] == app_id, event
                app = await status(nc, app_id)
        return app
    except TimeoutError:
        pytest.fail(f"app {app_id} did not reach {wanted} within {timeout:g} s\n{cluster.logs_tail()}")
    finally:
        await sub.unsubscribe()


@pytest_asyncio.fixture
async def nc(cluster):
    """A bare NATS connection to a cluster of the test's own (two workers registered)."""
    conn = await nats.connect(cluster.url)
    yield conn
    await conn.close()


@pytest_asyncio.fixture
async def shared_nc(shared_cluster):
    """A bare NATS connection to the file's shared cluster (two workers registered), for
    the tests that start no app: each checks that none was made."""
    conn = await nats.connect(shared_cluster.url)
    yield conn
    await conn.close()


# --- submission end to end ----------------------------------------------------------


async def test_wordcount_submitted_with_raw_messages(cluster, nc, tmp_path):
    rng = random.Random(7)
    vocabulary = [f"w{i}" for i in range(300)] + ["straße", "naïve", "日本"]
    lines = [" ".join(rng.choice(vocabulary) for _ in range(rng.randint(0, 12))) for _ in range(3000)]
    source, output = tmp_path / "input.txt", tmp_path / "counts.jsonl"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")

    # Every state event of every app, from before the submission on.
    seen: list[dict] = []
    ended = asyncio.Event()

    async def on_event(msg):
        seen.append(unpack(msg.data))
        if seen[-1]["state"] in TERMINAL:
            ended.set()

    everything = await nc.subscribe("app.*.state", cb=on_event)
    await nc.flush()

    with open(WORDCOUNT, "rb") as f:
        artifact = await upload(nc, f.read(), "wordcount")
    app_id = await submit(nc, artifact, "wordcount", ["--input", str(source), "--output", str(output)])

    app = await wait_for_state(nc, cluster, app_id, TERMINAL)
    assert app["state"] == "SUCCEEDED", f"{app}\n{cluster.logs_tail()}"
    assert app["app_id"] == app_id and app["name"] == "wordcount" and app["user"] == "raw-client"
    assert app["error"] is None
    assert app["finished_ms"] >= app["submitted_ms"] > 0
    assert app["appmaster_worker"] in ("worker-0", "worker-1")

    async with asyncio.timeout(10):  # this subscription's callbacks run on their own
        await ended.wait()
    await everything.unsubscribe()
    states = [e["state"] for e in seen if e["app_id"] == app_id]
    assert states == ["ACTIVE", "SUCCEEDED"], seen  # PENDING is never published
    assert all(e["type"] == "ApplicationStateChanged" and e["error"] is None for e in seen)

    assert read_counts(output) == dict(collections.Counter(source.read_text(encoding="utf-8").split()))


async def test_list_kill_and_status(cluster, nc, tmp_path):
    artifact = await upload(nc, ENDLESS_APP.encode(), "endless")
    app_id = await submit(nc, artifact, "endless", [])
    app = await wait_for_state(nc, cluster, app_id, {"ACTIVE"})
    assert app["finished_ms"] == 0

    # app.list, with and without finished apps; an unknown field is ignored, a
    # missing optional field takes its default (include_finished=True).
    listed = await list_apps(nc, future_field="ignored")
    assert [(a["app_id"], a["state"]) for a in listed] == [(app_id, "ACTIVE")]
    assert [a["app_id"] for a in await list_apps(nc, include_finished=False)] == [app_id]

    # Kill: Ack, then TERMINATED on app.<id>.state, then both processes exit.
    stopped: asyncio.Queue[dict] = asyncio.Queue()

    async def on_stopped(msg):
        stopped.put_nowait(unpack(msg.data))

    stop_sub = await nc.subscribe("master.executor.stopped", cb=on_stopped)
    await nc.flush()
    ack = await call(nc, "app.kill", "KillApplication", "Ack", app_id=app_id)
    assert isinstance(ack["detail"], str)
    app = await wait_for_state(nc, cluster, app_id, TERMINAL)
    assert app["state"] == "TERMINATED" and app["error"] is None and app["finished_ms"] > 0

    kinds = set()
    async with asyncio.timeout(30):
        while kinds != {"appmaster", "executor"}:
            report = await stopped.get()
            assert report["type"] == "ExecutorStopped", report
            if report["app_id"] != app_id:
                continue
            assert report["worker_id"] in ("worker-0", "worker-1") and isinstance(report["exit_code"], int)
            assert report["executor_id"] == (-1 if report["kind"] == "appmaster" else 0), report
            kinds.add(report["kind"])
    await stop_sub.unsubscribe()

    # Killing an app that already ended is a conflict; unknown ids are not found.
    message = await refused(nc, "app.kill", pack("KillApplication", app_id=app_id), "conflict")
    assert "already ended" in message and "TERMINATED" in message
    assert await list_apps(nc, include_finished=False) == []
    assert [(a["app_id"], a["state"]) for a in await list_apps(nc)] == [(app_id, "TERMINATED")]
    message = await refused(nc, "app.status", pack("QueryApplication", app_id=987654), "not_found")
    assert "987654" in message
    message = await refused(nc, "app.kill", pack("KillApplication", app_id=987654), "not_found")
    assert "987654" in message


async def test_submit_of_missing_artifact_is_not_found(shared_nc):
    payload = pack("SubmitApplication", name="ghost", artifact="ghost-0123456789abcdef.py", entry="ghost")
    message = await refused(shared_nc, "app.submit", payload, "not_found")
    assert "ghost-0123456789abcdef.py" in message and ARTIFACT_BUCKET in message
    assert await list_apps(shared_nc) == []  # no app was created


async def test_submit_rejects_invalid_values(shared_nc):
    artifact = await upload(shared_nc, ENDLESS_APP.encode(), "endless")
    valid = dict(name="endless", artifact=artifact, entry="endless")
    for change, expected in [
        ({"name": " "}, "name must not be empty"),
        ({"artifact_kind": "tar"}, "artifact_kind must be 'module' or 'zip'"),
        ({"entry": "not-a-module"}, "entry must be a Python module name"),
    ]:
        payload = pack("SubmitApplication", **{**valid, **change})
        message = await refused(shared_nc, "app.submit", payload, "bad_request")
        assert expected in message, (change, message)
    assert await list_apps(shared_nc) == []


async def test_submit_with_a_config_that_cannot_run_is_refused(shared_nc):
    """Checked against the application config of docs/operations.md, before an app exists."""
    artifact = await upload(shared_nc, ENDLESS_APP.encode(), "endless")
    for config, expected in [
        ({"chekpoint_interval_ms": 500}, "unknown application config key 'chekpoint_interval_ms': did you mean "
                                         "'checkpoint_interval_ms'?"),
        ({"state_backend": "no-such-backend"}, "state_backend must be one of memory, rocksdb, got 'no-such-backend'"),
        ({"checkpoint_interval_ms": -1}, "checkpoint_interval_ms must be an integer >= 0, got -1"),
        ({"executors": "2"}, "executors must be an integer >= 1, got '2'"),
        ({"stall_timeout_s": 0}, "stall_timeout_s must be a positive number, got 0"),
    ]:
        payload = pack("SubmitApplication", name="endless", artifact=artifact, entry="endless", config=config)
        message = await refused(shared_nc, "app.submit", payload, "bad_request")
        assert expected in message, (config, message)
    assert await list_apps(shared_nc) == []


async def test_app_that_cannot_load_fails_after_submit(cluster, nc):
    """The submit succeeds (the AppMaster registers first); loading fails the app."""
    artifact = await upload(nc, b"VALUE = 1  # defines no application()\n", "not_an_app")
    app_id = await submit(nc, artifact, "not_an_app", [])
    app = await wait_for_state(nc, cluster, app_id, TERMINAL)
    assert app["state"] == "FAILED", app
    error = app["error"]
    assert error["where"] == "loading the application", error
    assert error["error_type"] == "ArtifactError" and "application(args)" in error["message"], error
    assert isinstance(error["traceback"], str)


# --- malformed input ------------------------------------------------------------------

#: Per subject: the message type it serves, valid fields, and a field of the wrong type.
SERVED = {
    "app.submit": ("SubmitApplication", {"name": "x", "artifact": "x.py", "entry": "x"},
                   ("name", 42, "SubmitApplication.name: expected str, got int")),
    "app.kill": ("KillApplication", {"app_id": 1},
                 ("app_id", "1", "KillApplication.app_id: expected an integer, got str")),
    "app.status": ("QueryApplication", {"app_id": 1},
                   ("app_id", "1", "QueryApplication.app_id: expected an integer, got str")),
    "app.list": ("ListApplications", {},
                 ("include_finished", "yes", "ListApplications.include_finished: expected bool, got str")),
    "master.info": ("QueryCluster", {}, None),
}


def bad_inputs(subject: str) -> list[tuple[str, bytes, str]]:
    """(case, payload, expected substring of the ErrorReply message) for one subject."""
    type_, fields, wrong = SERVED[subject]
    other = "QueryCluster" if type_ != "QueryCluster" else "ListApplications"
    cases = [
        ("garbage bytes", b"\xc1\xc1 this is not msgpack", "not valid msgpack"),
        ("empty payload", b"", "not valid msgpack"),
        ("not a map", msgpack.packb([type_, 1]), "expected a msgpack map, got list"),
        ("no type", msgpack.packb({"v": 1, **fields}), 'message has no "type" field'),
        ("unknown type", pack("NoSuchMessage", **fields), "unknown message type 'NoSuchMessage'"),
        ("version 99", msgpack.packb({"type": type_, "v": 99, **fields}),
         f"{type_}: protocol version 99 is not supported; this peer speaks version 1"),
        ("no version", msgpack.packb({"type": type_, **fields}), f'{type_}: message has no protocol version field "v"'),
        ("wrong message type", pack(other), f"unexpected message type {other}; expected {type_}"),
    ]
    if wrong is not None:
        field, value, expected = wrong
        cases.append(("wrong field type", pack(type_, **{**fields, field: value}), expected))
    for field in fields:
        cases.append((f"missing {field}", pack(type_, **{k: v for k, v in fields.items() if k != field}),
                      f"{type_}: missing field(s) {field}"))
    if subject == "app.submit":
        cases.append(("bin instead of str", pack(type_, **{**fields, "entry": b"x"}),
                      "SubmitApplication.entry: expected str, got bytes"))
        cases.append(("list of wrong items", pack(type_, **fields, args=["ok", 7]),
                      "SubmitApplication.args[1]: expected str, got int"))
    return cases


@pytest.mark.parametrize("subject", list(SERVED))
async def test_bad_input_gets_bad_request(shared_nc, subject):
    for case, payload, expected in bad_inputs(subject):
        message = await refused(shared_nc, subject, payload, "bad_request")
        assert message.startswith(f"{subject}: "), (case, message)
        assert expected in message, (case, message)
    # The master is still there and still answers valid requests.
    assert await list_apps(shared_nc) == []
    info = await call(shared_nc, "master.info", "QueryCluster", "ClusterInfo")
    assert sorted(w["worker_id"] for w in info["workers"]) == ["worker-0", "worker-1"]


async def test_register_with_other_protocol_version_is_refused(shared_nc):
    payload = pack("RegisterWorker", worker_id="from-the-future", host="elsewhere", pid=1, slots=1,
                   protocol_version=2)
    message = await refused(shared_nc, "master.worker.register", payload, "bad_request")
    assert "protocol version 2" in message and "speaks 1" in message, message
    info = await call(shared_nc, "master.info", "QueryCluster", "ClusterInfo")
    assert "from-the-future" not in [w["worker_id"] for w in info["workers"]]


async def test_malformed_one_way_message_is_dropped(shared_cluster, shared_nc):
    malformed = [
        b"\xc1\xc1 garbage",
        b"",
        msgpack.packb([1, 2, 3]),
        msgpack.packb({"worker_id": "worker-0"}),
        pack("NoSuchMessage"),
        msgpack.packb({"type": "WorkerHeartbeat", "v": 99, "worker_id": "worker-0", "slots": 4, "slots_used": 0}),
        pack("WorkerHeartbeat", worker_id="worker-0", slots="four", slots_used=0),
        pack("QueryCluster"),
    ]
    log_path = os.path.join(shared_cluster.log_dir, "master-0.log")
    logged_before = os.path.getsize(log_path)  # the shared master's log: only what this test made counts
    for payload in malformed:
        await shared_nc.publish("master.worker.heartbeat", payload)
    await shared_nc.flush()

    # The master still answers, and still counts the real workers alive.
    assert shared_cluster.masters["master-0"].poll() is None, shared_cluster.logs_tail()
    assert await list_apps(shared_nc) == []
    info = await call(shared_nc, "master.info", "QueryCluster", "ClusterInfo")
    assert [(w["worker_id"], w["alive"]) for w in info["workers"]] == [("worker-0", True), ("worker-1", True)]

    # Each one was logged and dropped (the master logs JSON lines).
    if os.environ.get("GEARBUS_LOG_LEVEL", "info").lower() in ("debug", "info", "warning"):
        def dropped() -> int:
            count = 0
            with open(log_path, encoding="utf-8", errors="replace") as f:
                f.seek(logged_before)
                for line in f:
                    try:
                        entry = json.loads(line)
                    except ValueError:
                        continue
                    if entry.get("event") == "message_dropped" and entry.get("subject") == "master.worker.heartbeat":
                        count += 1
            return count

        async with asyncio.timeout(10):
            while dropped() < len(malformed):
                await asyncio.sleep(0.05)  # polls the log for a condition, not a fixed wait
    assert shared_cluster.masters["master-0"].poll() is None
    assert await list_apps(shared_nc) == []


# --- the document itself ----------------------------------------------------------------


def _doc_tables() -> dict[str, dict[str, tuple[str, str]]]:
    """{name: {field: (type, default)}} from every "### `Name`" field table of the doc."""
    tables: dict[str, dict[str, tuple[str, str]]] = {}
    current = None
    with open(DOC, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            heading = re.fullmatch(r"### `(\w+)`", line)
            if heading:
                current = heading.group(1)
                assert current not in tables, f"{current} is described twice"
                tables[current] = {}
            elif line.startswith("#"):
                current = None
            elif current and line.startswith("| `"):
                cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip()[1:-1])]
                tables[current][cells[0].strip("`")] = (cells[1], cells[2].strip("`"))
    return tables


def _type_text(hint) -> str:
    if hint is typing.Any:
        return "any"
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return " | ".join("nil" if a is type(None) else _type_text(a) for a in args)
    if origin is list:
        return f"list[{_type_text(args[0])}]"
    if origin is dict:
        return f"map[{_type_text(args[0])}, {_type_text(args[1])}]"
    return hint.__name__


def _default_text(field: dataclasses.Field) -> str:
    if field.default_factory is not dataclasses.MISSING:
        return json.dumps(field.default_factory())
    if field.default is dataclasses.MISSING:
        return "required"
    if field.default is None:
        return "nil"
    return json.dumps(field.default)


def test_doc_describes_every_message_field_and_subject():
    """docs/protocol.md matches shared/messages.py and shared/subjects.py exactly."""
    from shared import messages, subjects

    structs = [cls for cls in vars(messages).values() if isinstance(cls, type) and issubclass(cls, messages.Struct)
               and cls not in (messages.Struct, messages.Message) and not issubclass(cls, messages.Message)]
    documented = _doc_tables()
    for cls in structs + list(messages.Message.registry.values()):
        assert cls.__name__ in documented, f"docs/protocol.md has no table for {cls.__name__}"
        hints = typing.get_type_hints(cls)
        expected = {f.name: (_type_text(hints[f.name]), _default_text(f)) for f in dataclasses.fields(cls)}
        assert documented[cls.__name__] == expected, f"docs/protocol.md is out of date for {cls.__name__}"
    assert set(documented) == {c.__name__ for c in structs} | set(messages.Message.registry)

    with open(DOC, encoding="utf-8") as f:
        text = f.read()
    placeholders = {"app_id": "<app>", "worker_id": "<worker>", "executor_id": "<executor>",
                    "processor": "<processor>", "index": "<index>"}
    for name, value in vars(subjects).items():
        if name.startswith("_") or name in ("annotations", "STATE_BUCKET", "ARTIFACT_BUCKET", "MASTERS_BUCKET",
                                            "CHECKPOINT_BUCKET", "NEXT_APP_ID_KEY"):
            continue
        kv_keys = {"app_state_key": "`apps.<app>`", "worker_state_key": "`workers.<worker>`",
                   "master_registry_key": "`master.<id>`",
                   "checkpoint_object": "`app<app>/cp<id>e<epoch>/<processor>.<index>`",
                   "checkpoint_key": "`app<app>.cp<id>`", "checkpoint_latest_key": "`app<app>.latest`",
                   "checkpoint_epoch_key": "`app<app>.epoch`", "shell_output_key": "`app<app>.shell<executor>`",
                   "checkpoint_app_prefix": "`app<app>.`",
                   "savepoint_object": "`savepoints/<name>/<step>/<index>`", "savepoint_key": "`savepoint.<name>`"}
        if name in kv_keys:  # keys and object names of the buckets, listed with the buckets
            assert kv_keys[name] in text
            continue
        if isinstance(value, str):
            assert f"| `{value}` |" in text, f"subject {value} is not in the subject table"
        elif inspect.isfunction(value):
            params = inspect.signature(value).parameters
            subject = value(*(placeholders[p] for p in params))
            assert f"| `{subject}` |" in text, f"subject {subject} is not in the subject table"
    for bucket in (subjects.STATE_BUCKET, subjects.ARTIFACT_BUCKET, subjects.MASTERS_BUCKET,
                   subjects.CHECKPOINT_BUCKET):
        assert f"| `{bucket}` |" in text
