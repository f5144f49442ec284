"""Exactly-once under chaos: a kill every few seconds while a JetStream pipeline runs.

    python bench/chaos.py [--records 1000000] [--rate 8000] [--interval-ms 1000]
                          [--kill-every-s 5] [--kills executor,worker,appmaster,master,nats,powercut]
                          [--workers 3] [--masters 2] [--heartbeat-s 1.0] [--nats-signal term]
                          [--seed 42] [--recovery-timeout 60] [--keep]

An embedded cluster (a nats-server with a file store, 2 masters, 3 workers of 4 slots)
runs tests/apps/exactly_once.py with ``checkpoint_interval_ms=INTERVAL``: JSON events from a
4-subject JetStream stream into keyed 1-second tumbling-window counts (to a JetStream
stream, committed at checkpoints), a low-level task numbering each user's events (to a
JSON Lines file) and a global count per user (to another file). A publisher feeds the
stream at ``--rate`` events/s (acknowledged, deduplicated ids) until ``--records``, so the run
lasts about records / rate seconds; meanwhile, every ``--kill-every-s`` (and never before
the previous kill was recovered from), one of, in turn:

* executor  -- SIGKILL one executor process;
* worker    -- SIGKILL a worker (and so the executors it runs; one not hosting the
               AppMaster when possible), then start a replacement worker;
* appmaster -- SIGKILL the AppMaster;
* master    -- SIGKILL the leading master, then start a replacement standby;
* nats      -- restart the nats-server on the same port and store directory (SIGTERM, or
               SIGKILL with ``--nats-signal kill``, then start). The publisher is paused
               (all its messages acknowledged) around it, so the input keeps its order;
               the cluster's roles are not told anything.
* powercut  -- SIGKILL every process at once (masters, workers, AppMaster, executors and the
               nats-server), then start them all again on the same store; measured from
               the restart (the app must resume by itself).

Measured per kill, from the kill:

* checkpoint -- until the next checkpoint completes (for executor, worker and AppMaster
  kills: one of a newer epoch, i.e. after the rollback), as the AppMaster announces it
  (``executor.<app>.checkpoint.complete``) or, if that was missed, its heartbeat's
  ``last_completed_ms``;
* output     -- until the first window result committed by such a checkpoint is stored
  in the output stream (the stored message's JetStream timestamp; its ``Nats-Msg-Id``
  names the epoch and checkpoint that committed it).

Goal: both <= 3 s with a 1 s interval. At the end every output must equal a computation
made here from the events (nothing lost, nothing twice): the window counts, every event's
rank among its user's events, the per-user totals; the input stream must hold every event
once, in order. Exit 1 on wrong output, a failed app or a kill not recovered from within
``--recovery-timeout`` (an engine bug: the report names the cluster's log directory, kept).
"""

from __future__ import annotations

import asyncio
import collections
import json
import logging
import os
import random
import signal
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import nats  # noqa: E402
import structlog  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: E402

from common import BenchError, in_temp_dir, parser_from_doc  # noqa: E402  (bench/, beside this file)
from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from gearbus.connectors.jetstream import Publisher, api, ensure_stream_async  # noqa: E402
from gearbus.natsserver import NatsServer  # noqa: E402
from shared import subjects  # noqa: E402
from shared.messages import (  # noqa: E402
    AppMasterHeartbeat,
    ApplicationStateChanged,
    AppState,
    CheckpointComplete,
    MasterElected,
    decode,
)

APP = os.path.join(REPO, "tests", "apps", "exactly_once.py")
IN_STREAM, OUT_STREAM, OUT_SUBJECT = "CHAOSEV", "CHAOSOUT", "chaos.windows"
USERS = 50
BASE_TS = 1_700_000_000_000
KINDS = ("executor", "worker", "appmaster", "master", "nats", "powercut")
ROLLBACK = {"executor", "worker", "appmaster"}  # kills after which the app rolls back (a new epoch)
TARGET_S = 3.0


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wall_ms() -> float:
    return time.time() * 1000


# --------------------------------------------------------------------------- data


def event(n: int) -> tuple[str, dict]:
    """Event n and its subject (as tests/chaos): each user always on one of four subjects."""
    k = (n * 7919) % USERS
    return f"ev.{k % 4}", {"id": n, "user": f"u{k}", "ts": BASE_TS + n * 5}


def expected_outputs(records: int):
    windows, ranks, totals, seen = collections.Counter(), [], collections.Counter(), collections.Counter()
    for n in range(records):
        _, e = event(n)
        windows[(e["user"], (e["ts"] // 1000) * 1000)] += 1
        seen[e["user"]] += 1
        ranks.append(seen[e["user"]])  # event n's rank among its user's events
        totals[e["user"]] += 1
    return windows, ranks, dict(totals)


async def _quiet(error: Exception) -> None:
    """nats-py's default error callback logs a traceback per failed reconnect attempt."""


async def connect(url: str, name: str):
    return await nats.connect(url, name=name, max_reconnect_attempts=-1, reconnect_time_wait=0.1,
                              connect_timeout=5, pending_size=64 << 20, error_cb=_quiet)


class Feeder:
    """Publishes events first..records-1 in order at ``rate``, acknowledged (ids ``ev-n``,
    so a republish is deduplicated); can be paused with everything acknowledged."""

    def __init__(self, url: str, records: int, rate: float):
        self.url, self.records, self.rate = url, records, rate
        self.next = 0
        self.gate = asyncio.Event()
        self.gate.set()
        self.pause_wanted = False
        self.paused = asyncio.Event()

    async def run(self, until: int) -> None:
        nc = await connect(self.url, "chaos-feeder")
        try:
            publisher = await Publisher(nc, ack_timeout=1.0, retries=120).open()
            loop = asyncio.get_running_loop()
            step = max(1, int(self.rate) // 50)
            origin = loop.time() - self.next / self.rate
            while self.next < until:
                subject, e = event(self.next)
                await publisher.publish(subject, json.dumps(e).encode(), f"ev-{self.next}")
                self.next += 1
                if self.next % step == 0:
                    if self.pause_wanted:
                        await publisher.drain()
                        self.paused.set()
                        await self.gate.wait()
                        origin = loop.time() - self.next / self.rate
                    ahead = origin + self.next / self.rate - loop.time()
                    if ahead > 0:
                        await asyncio.sleep(ahead)
            await publisher.drain()
        finally:
            self.paused.set()  # nothing more will be published: a pause has nothing to wait for
            await nc.close()

    async def pause(self) -> None:
        self.paused.clear()
        self.gate.clear()
        self.pause_wanted = True
        await self.paused.wait()

    def resume(self) -> None:
        self.pause_wanted = False
        self.gate.set()


# --------------------------------------------------------------------------- watching the app


class Watch:
    """Checkpoint completions (announcements and heartbeats), the app's state, its epoch."""

    def __init__(self, client: Client):
        self.client = client
        self.app_id: int | None = None
        #: (epoch, checkpoint id) -> completion wall ms (the earliest known)
        self.completed: dict[tuple[int, int], float] = {}
        self.changed = asyncio.Event()
        self.heartbeat: AppMasterHeartbeat | None = None
        self.state = ""
        self.ended = asyncio.Event()

    async def start(self) -> Watch:
        nc = self.client.bus.nc
        await nc.subscribe("executor.*.checkpoint.complete", cb=self._on_complete)
        await nc.subscribe(subjects.appmaster_heartbeat("*"), cb=self._on_heartbeat)
        await nc.subscribe("app.*.state", cb=self._on_state)
        return self

    def _note(self, epoch: int, checkpoint_id: int, at_ms: float) -> None:
        key = (epoch, checkpoint_id)
        if key not in self.completed or at_ms < self.completed[key]:
            self.completed[key] = at_ms
            self.changed.set()

    async def _on_complete(self, msg) -> None:
        now = wall_ms()
        if self.app_id is None or msg.subject != subjects.checkpoint_complete(self.app_id):
            return
        try:
            done = decode(msg.data, (CheckpointComplete,))
        except Exception:
            return
        self._note(done.epoch, done.checkpoint_id, now)

    async def _on_heartbeat(self, msg) -> None:
        try:
            hb = decode(msg.data, (AppMasterHeartbeat,))
        except Exception:
            return
        if hb.app_id != self.app_id:
            return
        self.heartbeat = hb
        cp = hb.checkpoints
        if cp and cp.last_id:
            self._note(cp.epoch, cp.last_id, cp.last_completed_ms)
        self.changed.set()

    async def _on_state(self, msg) -> None:
        try:
            event_ = decode(msg.data, (ApplicationStateChanged,))
        except Exception:
            return
        if event_.app_id == self.app_id:
            self.state = event_.state
            if event_.state in AppState.TERMINAL:
                self.ended.set()
                self.changed.set()

    def epoch(self) -> int:
        known = [e for e, _ in self.completed]
        if self.heartbeat and self.heartbeat.checkpoints:
            known.append(self.heartbeat.checkpoints.epoch)
        return max(known, default=0)

    def first_after(self, since_ms: float, min_epoch: int) -> tuple[tuple[int, int], float] | None:
        found = [(at, key) for key, at in self.completed.items() if at > since_ms and key[0] >= min_epoch]
        if not found:
            return None
        at, key = min(found)
        return key, at

    async def wait_for(self, predicate, timeout: float):
        deadline = time.monotonic() + timeout
        while True:
            result = predicate()
            if result:
                return result
            if self.ended.is_set():
                raise BenchError(f"the app ended {self.state} while waiting for it to recover")
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), min(remaining, 0.5))
            except TimeoutError:
                pass


async def stream_last_seq(nc, stream: str, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while True:  # the connection may still be coming back from a nats-server restart
        try:
            return (await api(nc, f"$JS.API.STREAM.INFO.{stream}"))["state"]["last_seq"]
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


def committed_by(msg) -> tuple[int, int] | None:
    """(epoch, checkpoint id) from a transactional sink's Nats-Msg-Id
    ``app.start/step/task/epoch/checkpoint/i``."""
    msg_id = (msg.headers or {}).get("Nats-Msg-Id", "")
    parts = msg_id.split("/")
    try:
        return int(parts[-3]), int(parts[-2])
    except (IndexError, ValueError):
        return None


async def first_output_from(nc, after_seq: int, since: tuple[int, int], timeout: float) -> tuple[float, int] | None:
    """The stored time (wall ms) and sequence of the first output message after ``after_seq``
    committed by checkpoint ``since`` (epoch, id) or a later one."""
    js = nc.jetstream()
    deadline = time.monotonic() + timeout
    while True:  # the connection may still be coming back from a nats-server restart
        try:
            info = await nc.jsm().add_consumer(OUT_STREAM, ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
                opt_start_seq=after_seq + 1, headers_only=True, mem_storage=True, inactive_threshold=60))
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    try:
        sub = await js.pull_subscribe_bind(info.name, OUT_STREAM)
        while time.monotonic() < deadline:
            try:
                msgs = await sub.fetch(500, timeout=1)
            except (TimeoutError, nats.errors.TimeoutError):
                continue
            for msg in msgs:
                by = committed_by(msg)
                if by is not None and by >= since:
                    return msg.metadata.timestamp.timestamp() * 1000, msg.metadata.sequence.stream
        return None
    finally:
        try:
            await nc.jsm().delete_consumer(OUT_STREAM, info.name)
        except Exception:
            pass


class Chaos:
    def __init__(self, cluster: LocalCluster, server: NatsServer, client: Client, watch: Watch, feeder: Feeder,
                 opts, rng: random.Random):
        self.cluster, self.server, self.client, self.watch, self.feeder = cluster, server, client, watch, feeder
        self.opts, self.rng = opts, rng
        self.count = 0
        self.seen_pids: set[int] = set()

    def _track(self) -> list[tuple[int, str, str]]:
        procs = self.cluster.processes()
        self.seen_pids.update(p for p, _, _ in procs)
        return procs

    async def executor(self) -> tuple[float, str]:
        victims = [p for p in self._track() if p[2] == "executor"]
        if not victims:
            raise BenchError("no executor process to kill")
        pid, worker, _ = self.rng.choice(victims)
        at = wall_ms()
        os.kill(pid, signal.SIGKILL)
        return at, f"executor pid {pid} on {worker}"

    async def worker(self) -> tuple[float, str]:
        procs = self._track()
        am_workers = {w for _, w, k in procs if k == "appmaster"}
        hosting = sorted({w for _, w, k in procs if k == "executor"})
        if not hosting:
            raise BenchError("no worker runs an executor")
        choices = [w for w in hosting if w not in am_workers] or hosting
        worker_id = self.rng.choice(choices)
        process = self.cluster.workers[worker_id]
        hosted = [f"{k} {p}" for p, w, k in procs if w == worker_id]
        at = wall_ms()
        process.send_signal(signal.SIGKILL)
        await asyncio.get_running_loop().run_in_executor(None, process.wait)
        self.cluster.workers.pop(worker_id)
        self.count += 1
        replacement = f"worker-r{self.count}"
        self.cluster.start_worker(replacement)
        return at, f"{worker_id} ({', '.join(hosted)}); replaced by {replacement}"

    async def appmaster(self) -> tuple[float, str]:
        found = [p for p in self._track() if p[2] == "appmaster"]
        if not found:
            raise BenchError("no AppMaster process to kill")
        pid, worker, _ = found[0]
        at = wall_ms()
        os.kill(pid, signal.SIGKILL)
        return at, f"AppMaster pid {pid} on {worker}"

    async def master(self) -> tuple[float, str]:
        leader = (await self.client.info()).leader
        elected = asyncio.get_running_loop().create_future()

        async def on_elected(msg):
            try:
                event_ = decode(msg.data, (MasterElected,))
            except Exception:
                return
            if event_.master_id != leader and not elected.done():
                elected.set_result((wall_ms(), event_.master_id))

        sub = await self.client.bus.nc.subscribe(subjects.MASTER_ELECTED, cb=on_elected)
        process = self.cluster.masters[leader]
        at = wall_ms()
        process.send_signal(signal.SIGKILL)
        try:
            elected_ms, new_leader = await asyncio.wait_for(elected, 30)
        except TimeoutError:
            raise BenchError(f"no master took over within 30 s of killing {leader}") from None
        finally:
            await sub.unsubscribe()
        await asyncio.get_running_loop().run_in_executor(None, process.wait)
        self.cluster.masters.pop(leader)
        self.count += 1
        standby = f"master-r{self.count}"
        self.cluster.start_master(standby)
        return at, f"leader {leader}; {new_leader} elected after {(elected_ms - at) / 1000:.2f} s; standby {standby}"

    async def nats(self) -> tuple[float, str]:
        await self.feeder.pause()
        loop = asyncio.get_running_loop()
        at = wall_ms()
        if self.opts.nats_signal == "kill":
            self.server.process.send_signal(signal.SIGKILL)
            await loop.run_in_executor(None, self.server.process.wait)
        else:
            await loop.run_in_executor(None, self.server.stop)
        down = wall_ms()
        if self.opts.nats_down_s:
            await asyncio.sleep(self.opts.nats_down_s)
        await loop.run_in_executor(None, self.server.start)
        up = wall_ms()
        self.feeder.resume()
        return at, (f"nats-server SIG{self.opts.nats_signal.upper()}, down after {(down - at) / 1000:.2f} s, "
                    f"listening again after {(up - at) / 1000:.2f} s")

    async def powercut(self) -> tuple[float, str]:
        """Every process at once, the nats-server too; then all started again on the same
        store. Measured from the restart."""
        await self.feeder.pause()
        loop = asyncio.get_running_loop()
        killed = len(self._track()) + len(self.cluster.masters) + len(self.cluster.workers) + 1
        self.server.process.send_signal(signal.SIGKILL)
        await loop.run_in_executor(None, self.cluster.power_cut)
        await loop.run_in_executor(None, self.server.process.wait)
        at = wall_ms()
        await loop.run_in_executor(None, self.server.start)
        self.cluster.restart()
        self.feeder.resume()
        return at, f"{killed} processes SIGKILLed at once; measured from the restart"


# --------------------------------------------------------------------------- verification


async def read_all(nc, stream: str, subject: str) -> list[bytes]:
    """Every message of a stream on subjects matching ``subject``, in stream order (an
    ordered consumer: nats-py's fastest way to read a stream)."""
    state = (await api(nc, f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subject}))["state"]
    expected = sum((state.get("subjects") or {}).values())
    if not expected:
        return []
    got: list[bytes] = []
    done = asyncio.Event()

    async def on_msg(msg):
        got.append(msg.data)
        if len(got) >= expected:
            done.set()

    sub = await nc.jetstream().subscribe(subject, stream=stream, ordered_consumer=True, cb=on_msg,
                                         pending_msgs_limit=2_000_000, pending_bytes_limit=1 << 30)
    await asyncio.wait_for(done.wait(), 300)
    await sub.unsubscribe()
    return got[:expected]


def check_outputs(records: int, inputs: list[bytes], windows: list[bytes], running_path: str,
                  totals_path: str) -> list[str]:
    problems = []
    ids = []
    for data in inputs:
        ids.append(json.loads(data)["id"])
    if ids != list(range(records)):
        dup = len(ids) - len(set(ids))
        problems.append(f"input stream: {len(ids)} events, {dup} duplicated, "
                        f"{'in order' if ids == sorted(ids) else 'NOT in order'} (expected 0..{records - 1} once, "
                        "in order: the expected outputs assume it)")
    exp_windows, exp_ranks, exp_totals = expected_outputs(records)

    got_windows: dict[tuple, int] = {}
    twice = []
    for data in windows:
        row = json.loads(data)
        key = (row["user"], row["start"])
        if key in got_windows:
            twice.append((key, got_windows[key], row["count"]))
        got_windows[key] = row["count"]
    missing = [k for k in exp_windows if k not in got_windows]
    extra = [k for k in got_windows if k not in exp_windows]
    wrong = [k for k in exp_windows if k in got_windows and got_windows[k] != exp_windows[k]]
    if twice:
        problems.append(f"windows: {len(twice)} published twice, e.g. {twice[:3]}")
    if missing or extra or wrong:
        problems.append(f"windows: {len(windows)} rows for {len(exp_windows)} expected; {len(missing)} missing "
                        f"(e.g. {[(k, exp_windows[k]) for k in missing[:3]]}), {len(extra)} unexpected, "
                        f"{len(wrong)} wrong (e.g. {[(k, got_windows[k], exp_windows[k]) for k in wrong[:3]]})")

    if not os.path.exists(running_path):
        problems.append(f"running: {running_path} was not written")
    else:
        rank = [0] * records  # by event id: the rank written (0: none)
        rows = twice_ids = wrong_user = unknown = 0
        with open(running_path, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                rows += 1
                n = r["id"]
                if not (isinstance(n, int) and 0 <= n < records):
                    unknown += 1
                    continue
                if rank[n]:
                    twice_ids += 1
                rank[n] = r["rank"]
                wrong_user += r["user"] != event(n)[1]["user"]
        lost = rank.count(0)
        wrong_rank = sum(1 for got, want in zip(rank, exp_ranks) if got and got != want)
        if rows != records or lost or twice_ids or wrong_user or unknown or wrong_rank:
            problems.append(f"running: {rows} rows for {records} events: {lost} events missing, {twice_ids} written "
                            f"more than once, {wrong_rank} with a wrong rank, {wrong_user} with a wrong user, "
                            f"{unknown} unknown ids")
    if not os.path.exists(totals_path):
        problems.append(f"totals: {totals_path} was not written")
    else:
        with open(totals_path, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f]
        got_totals = {r["user"]: r["count"] for r in rows}
        if len(rows) != len(exp_totals) or got_totals != exp_totals:
            diff = {u: (got_totals.get(u), c) for u, c in exp_totals.items() if got_totals.get(u) != c}
            problems.append(f"totals: {len(rows)} rows for {len(exp_totals)} users; differing (got, want): "
                            f"{dict(list(diff.items())[:5])}")
    return problems


# --------------------------------------------------------------------------- the run


async def run(opts, tmp: str) -> int:
    load_before = os.getloadavg()[0]
    store = os.path.join(tmp, "jetstream")
    os.makedirs(store)
    out_dir = os.path.join(tmp, "out")
    os.makedirs(out_dir)
    running_path, totals_path = os.path.join(out_dir, "running.jsonl"), os.path.join(out_dir, "totals.jsonl")
    log_dir = os.path.join(tmp, "logs")
    server = NatsServer(store_dir=store, log_path=os.path.join(tmp, "nats-server.log"))
    server.start()
    cluster = LocalCluster(workers=opts.workers, slots=opts.slots, masters=opts.masters, log_dir=log_dir,
                           nats=server, heartbeat_interval=opts.heartbeat_s)
    rng = random.Random(opts.seed)
    kills: list[dict] = []
    failure = None
    feeder = Feeder(server.url, opts.records, opts.rate)
    chaos = None
    started, started_wall = time.monotonic(), time.time()
    try:
        cluster.start()
        async with Client(server.url, timeout=60) as client:
            nc = client.bus.nc
            await ensure_stream_async(nc, IN_STREAM, ["ev.*"], 300, "file")
            await ensure_stream_async(nc, OUT_STREAM, [OUT_SUBJECT], 600, "file")
            deadline = time.monotonic() + 60
            while sum(w.alive for w in (await client.info()).workers) < opts.workers:
                if time.monotonic() > deadline:
                    raise BenchError(f"{opts.workers} workers did not register within 60 s")
                await asyncio.sleep(0.2)
            watch = await Watch(client).start()
            await feeder.run(min(1000, opts.records))  # every subject exists before the app starts
            feeding = asyncio.create_task(feeder.run(opts.records))
            app_id = await client.submit(
                pack(APP), ["--stream", IN_STREAM, "--until", str(opts.records), "--windows-subject", OUT_SUBJECT,
                            "--running", running_path, "--totals", totals_path],
                config={"checkpoint_interval_ms": opts.interval_ms, "max_restarts": 10_000,
                        "appmaster_restarts": 10_000, "blacklist_after": 10_000})
            watch.app_id = app_id
            log(f"app {app_id} submitted; publishing {opts.records:,} events at {opts.rate:,.0f}/s "
                f"(about {opts.records / opts.rate:.0f} s); logs in {log_dir}")
            first = await watch.wait_for(lambda: watch.first_after(0, 0), 120)
            if not first:
                raise BenchError("no checkpoint completed within 120 s of submitting")
            log(f"first checkpoint {first[0]} completed; chaos begins")
            chaos = Chaos(cluster, server, client, watch, feeder, opts, rng)
            order = [k for k in opts.kills if k]
            last_kill = time.monotonic()
            i = 0
            out_nc = await connect(server.url, "chaos-output-watch")
            try:
                while order and not feeding.done() and feeder.next < opts.records - opts.rate * opts.kill_every_s:
                    wait = last_kill + opts.kill_every_s - time.monotonic()
                    if wait > 0:
                        await asyncio.wait([feeding], timeout=wait)
                        if feeding.done():
                            break
                    kind = order[i % len(order)]
                    i += 1
                    epoch0 = watch.epoch()
                    restarts0 = watch.heartbeat.restarts if watch.heartbeat else 0
                    out_seq0 = await stream_last_seq(out_nc, OUT_STREAM)
                    published = feeder.next
                    kill_ms, detail = await getattr(chaos, kind)()
                    last_kill = time.monotonic()
                    entry = {"n": len(kills) + 1, "kind": kind, "t": kill_ms / 1000 - started_wall, "detail": detail,
                             "epoch0": epoch0, "published": published}
                    kills.append(entry)
                    min_epoch = epoch0 + 1 if kind in ROLLBACK else epoch0
                    found = await watch.wait_for(lambda: watch.first_after(kill_ms, min_epoch), opts.recovery_timeout)
                    if not found:
                        entry["checkpoint_s"] = None
                        failure = (f"kill {entry['n']} ({kind}: {detail}): no checkpoint of epoch >= {min_epoch} "
                                   f"completed within {opts.recovery_timeout:g} s")
                        break
                    (epoch1, cp_id), cp_ms = found
                    entry.update(checkpoint_s=(cp_ms - kill_ms) / 1000, epoch1=epoch1, checkpoint=cp_id)
                    stored = await first_output_from(out_nc, out_seq0, (epoch1, cp_id), opts.recovery_timeout)
                    if stored is None:
                        entry["output_s"] = None
                        failure = (f"kill {entry['n']} ({kind}: {detail}): no output committed by checkpoint "
                                   f"{cp_id} (epoch {epoch1}) or later within {opts.recovery_timeout:g} s")
                        break
                    entry["output_s"] = (stored[0] - kill_ms) / 1000
                    entry["restarts"] = (watch.heartbeat.restarts if watch.heartbeat else 0) - restarts0
                    log(f"kill {entry['n']}: {kind} ({detail}): checkpoint {cp_id} of epoch {epoch1} after "
                        f"{entry['checkpoint_s']:.2f} s, output after {entry['output_s']:.2f} s")
            finally:
                await out_nc.close()

            if failure:
                status = await client.status(app_id)
                raise BenchError(f"{failure}\n  app state {status.state}, restarts {status.restarts}, "
                                 f"checkpoints {status.checkpoints}\n  error {status.error}")
            await feeding
            log(f"published all {opts.records:,} events after {time.monotonic() - started:.0f} s; waiting for the app")
            final = await client.wait(app_id, timeout=opts.end_timeout)
            if final.state != AppState.SUCCEEDED:
                raise BenchError(f"app {app_id} ended {final.state}: {final.error}")
            total_s = time.monotonic() - started
            late = sum(t.late_records for t in final.tasks)
            log(f"app SUCCEEDED after {total_s:.0f} s (epoch {final.checkpoints.epoch}; the last AppMaster counted "
                f"{final.restarts} restarts, {final.checkpoints.completed} checkpoints completed and "
                f"{final.checkpoints.failed} failed; {late} late records); verifying")
            inputs = await read_all(nc, IN_STREAM, "ev.*")
            windows = await read_all(nc, OUT_STREAM, OUT_SUBJECT)
    except BenchError as exc:
        failure = str(exc)
        final = None
    finally:
        cluster.stop()
        server.stop()
        if chaos:  # anything a killed worker left behind (its children die with it)
            for pid in chaos.seen_pids:
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as f:
                        if b"services." in f.read():
                            os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass

    print_report(opts, kills, load_before)
    if failure:
        print(f"\nFAILED: {failure}\nlogs (one per master/worker, with its children's JSON lines): {log_dir}"
              " (kept)", file=sys.stderr)
        opts.keep = True
        return 1
    problems = check_outputs(opts.records, inputs, windows, running_path, totals_path)
    if problems:
        print("\nFAILED: outputs differ from the independent computation:\n  " + "\n  ".join(problems),
              file=sys.stderr)
        print(f"logs: {log_dir} (kept)", file=sys.stderr)
        opts.keep = True
        return 1
    print(f"exactly-once: every output equals the independent computation ({opts.records:,} events in order in "
          f"the input; {len(windows):,} window counts, {opts.records:,} ranks, {USERS} totals: nothing lost, "
          f"nothing twice); app SUCCEEDED in {total_s:.0f} s after {len(kills)} kills, in epoch "
          f"{final.checkpoints.epoch} (rollbacks)")
    return 0


def print_report(opts, kills: list[dict], load_before: float) -> None:
    if not kills:
        print("\nno kills were made (the run was too short for --kill-every-s)")
        return

    def fmt(v):
        return "-" if v is None else f"{v:.2f}"

    print(f"\nchaos: {opts.records:,} events at {opts.rate:,.0f}/s, checkpoint interval {opts.interval_ms} ms, a kill "
          f"every >= {opts.kill_every_s:g} s, {opts.masters} masters, {opts.workers} workers, heartbeat "
          f"{opts.heartbeat_s:g} s; {os.cpu_count()} CPUs, load {load_before:.2f} before, {os.getloadavg()[0]:.2f} after")
    header = ("#", "at s", "kill", "epoch", "checkpoint s", "output s", "what")
    rows = [(str(k["n"]), f"{k['t']:.1f}", k["kind"],
             f"{k['epoch0']}->{k.get('epoch1', '?')}", fmt(k.get("checkpoint_s")), fmt(k.get("output_s")),
             k["detail"]) for k in kills]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for j, row in enumerate([header] + rows):
        print("  ".join(c.rjust(w) if i in (0, 1, 4, 5) else c.ljust(w)
                        for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
    print()
    header = ("kill", "n", "checkpoint s median", "max", "output s median", "max", f"output median <= {TARGET_S:g} s")
    rows, missing = [], []
    for kind in list(dict.fromkeys([k["kind"] for k in kills])) + ["all"]:
        sel = [k for k in kills if kind in ("all", k["kind"])]
        cps = [k["checkpoint_s"] for k in sel if k.get("checkpoint_s") is not None]
        outs = [k["output_s"] for k in sel if k.get("output_s") is not None]
        med_out = statistics.median(outs) if outs else None
        if kind == "all":
            verdict = f"MISSES for {', '.join(missing)}" if missing else "meets for every kind"
        else:
            verdict = "-" if med_out is None else ("meets" if med_out <= TARGET_S else "MISSES")
            if med_out is None or med_out > TARGET_S:
                missing.append(kind)
        rows.append((kind, str(len(sel)), fmt(statistics.median(cps) if cps else None), fmt(max(cps) if cps else None),
                     fmt(med_out), fmt(max(outs) if outs else None), verdict))
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    for j, row in enumerate([header] + rows):
        print("  ".join(c.ljust(w) if i in (0, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))
    print("checkpoint s: kill -> the next checkpoint completing (after executor/worker/AppMaster kills: one of the "
          "new epoch); output s: kill -> the first window result committed by that checkpoint or a later one, "
          "stored in the output stream (goal <= 3 s, median)")


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--records", type=int, default=1_000_000, help="events published into the input stream")
    parser.add_argument("--rate", type=float, default=8_000, help="events/s published (the run lasts records/rate s)")
    parser.add_argument("--interval-ms", type=int, default=1000, help="checkpoint_interval_ms of the app")
    parser.add_argument("--kill-every-s", type=float, default=5.0,
                        help="seconds between kills (at least; a kill also waits for the previous recovery)")
    parser.add_argument("--kills", default=",".join(KINDS),
                        help="kill kinds, cycled in this order, comma-separated ('' for none: a run without kills)")
    parser.add_argument("--workers", type=int, default=3, help="workers (a killed one is replaced)")
    parser.add_argument("--slots", type=int, default=4, help="slots per worker")
    parser.add_argument("--masters", type=int, default=2, help="masters (a killed leader is replaced)")
    parser.add_argument("--heartbeat-s", type=float, default=1.0, help="the cluster's heartbeat interval")
    parser.add_argument("--nats-signal", choices=("term", "kill"), default="term", help="how nats-server is stopped")
    parser.add_argument("--nats-down-s", type=float, default=0.0, help="seconds nats-server stays down")
    parser.add_argument("--seed", type=int, default=42, help="seeds which executor/worker is killed")
    parser.add_argument("--recovery-timeout", type=float, default=60.0,
                        help="seconds a kill may take to recover from before the run fails")
    parser.add_argument("--end-timeout", type=float, default=600.0,
                        help="seconds the app may take to end after the last event is published")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (logs, outputs, store)")
    opts = parser.parse_args(argv)
    opts.kills = [k.strip() for k in opts.kills.split(",") if k.strip()]
    bad = [k for k in opts.kills if k not in KINDS]
    if bad:
        parser.error(f"unknown kill kinds {bad}; choose from {','.join(KINDS)}")
    if opts.records < 1000 or opts.rate <= 0 or opts.interval_ms < 1 or opts.kill_every_s <= 0:
        parser.error("--records >= 1000, --rate > 0, --interval-ms >= 1, --kill-every-s > 0")
    if opts.masters < 2 and "master" in opts.kills:
        parser.error("killing the leading master needs --masters 2 or more")
    # This process's client logs every disconnect and reconnect around a nats-server restart.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    return in_temp_dir("gearbus-chaos-", opts.keep, lambda tmp: asyncio.run(run(opts, tmp)))


if __name__ == "__main__":
    sys.exit(main())
