"""Checkpoint cost: the same JetStream pipeline with checkpoints off and every second.

    python bench/checkpoints.py [--events 500000] [--users 100] [--subjects 4]
                                [--window-ms 10000] [--interval-ms 1000] [--repeat 1]
                                [--parallelism 2] [--seed 42] [--no-source] [--raw-mode ordered]
                                [--timeout 600] [--keep]

Fills a JetStream stream with N seeded JSON events ``{"id", "user", "ts"}`` over S subjects
(a user always on one subject; event times 1 ms apart, in order), starts an embedded
cluster (a nats-server with a file store, a master, two workers) and, in the same run:

* runs bench/checkpoint_app.py in window mode -- read_jetstream(until="now") -> group_by
  user -> tumbling-window count -> write_jetstream, parallelism P on P executors -- with
  ``checkpoint_interval_ms=0`` (periodic checkpoints off; a bounded app still ends with
  one, which commits the output) and ``=INTERVAL``, alternating, ``--repeat`` times each;
  times each run from ACTIVE to SUCCEEDED (as published on the app's state subject) and
  reports events/s, the ratio on/off (goal >= 0.95; Quix Streams advertises "at worst
  10 % slower"), and the checkpoints: completed and failed per run, the duration and size
  of the periodic ones (every record the AppMaster puts into the checkpoint KV bucket)
  and of the last one (the final checkpoint a bounded app ends with); also from submit
  to SUCCEEDED (executor launch included: tasks may start reading just before ACTIVE);
* checks every run's window counts, read back from the output stream, equal a count made
  here from the generated events (exit 1 if not: nothing missing, nothing twice);
* unless ``--no-source``: runs the app in source mode -- read_jetstream with P source
  tasks -> a filter dropping every event -> a discarding sink, checkpoints at INTERVAL --
  beside a raw nats-py reader: P processes, each reading the subjects source task i
  reads (sorted subjects i, i+P, ...) through one consumer -- an ordered push consumer
  (``--raw-mode ordered``, nats-py's fastest path) or an ephemeral pull consumer fetching
  batches (``--raw-mode pull``, about 4x slower in nats-py 2.16) -- and decoding each
  event's JSON as the source does; alternating, ``--repeat`` times each.
  The ratio says how close the source comes to nats-py, and source-alone / windowed says
  whether the source is the pipeline's bottleneck (goal: it is not, i.e. well above 1).

With ``--repeat R`` the table shows median and best; ratios are of medians and of bests.
This is a benchmark, not a test: it only fails on wrong output or a failed run.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import os
import random
import re
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

import msgpack  # noqa: E402
import nats  # noqa: E402
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy  # noqa: E402

from common import BenchError, count_problems, in_temp_dir, parser_from_doc  # noqa: E402  (bench/, beside this file)
from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from gearbus.connectors.jetstream import Publisher, api, ensure_stream_async  # noqa: E402
from gearbus.natsserver import NatsServer  # noqa: E402
from shared import subjects as bus_subjects  # noqa: E402
from shared.messages import ApplicationStateChanged, AppState, decode  # noqa: E402

APP = os.path.join(REPO, "bench", "checkpoint_app.py")
STREAM = "CPBENCH"
SUBJECT_PREFIX = "cpbench.ev"
OUT_STREAM = "CPBENCHOUT"
OUT_PREFIX = "cpbench.out"
BASE_TS = 1_700_000_000_000

TARGET_RATIO = 0.95  # checkpointed / unchecked throughput (the goal)
QUIX_RATIO = 0.90  # Quix Streams: "at worst 10 % slower"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- data


def events(n: int, users: int, subjects: int, seed: int):
    """(subject, payload bytes, user, ts) of event 0..n-1; deterministic for a seed."""
    rng = random.Random(seed)
    for i in range(n):
        k = rng.randrange(users)
        ts = BASE_TS + i
        yield (f"{SUBJECT_PREFIX}.{k % subjects}",
               json.dumps({"id": i, "user": f"u{k}", "ts": ts}, separators=(",", ":")).encode(), f"u{k}", ts)


async def fill(url: str, opts) -> collections.Counter:
    """Publish the events (acknowledged); return the expected window counts."""
    expected: collections.Counter = collections.Counter()
    w = opts.window_ms
    nc = await nats.connect(url)
    try:
        await ensure_stream_async(nc, STREAM, [f"{SUBJECT_PREFIX}.*"], 120, "file")
        await ensure_stream_async(nc, OUT_STREAM, [f"{OUT_PREFIX}.*"], 600, "file")
        publisher = await Publisher(nc).open()
        started = time.perf_counter()
        for subject, data, user, ts in events(opts.events, opts.users, opts.subjects, opts.seed):
            await publisher.publish(subject, data, None)
            expected[(user, ts - ts % w)] += 1
        await publisher.drain()
        state = (await api(nc, f"$JS.API.STREAM.INFO.{STREAM}"))["state"]
        if state["messages"] != opts.events:
            raise BenchError(f"stream {STREAM} holds {state['messages']} messages, {opts.events} published")
        log(f"filled {STREAM}: {opts.events:,} events over {opts.subjects} subjects, {opts.users} users "
            f"(seed {opts.seed}), {state['bytes'] / 1e6:.1f} MB, in {time.perf_counter() - started:.1f} s")
    finally:
        await nc.close()
    return expected


async def stream_subjects(nc, stream: str, subject_filter: str) -> dict[str, int]:
    """The stream's concrete subjects matching a filter, with their message counts."""
    found: dict[str, int] = {}
    while True:
        reply = await api(nc, f"$JS.API.STREAM.INFO.{stream}", {"subjects_filter": subject_filter,
                                                                  "offset": len(found)})
        page = reply["state"].get("subjects") or {}
        found.update(page)
        if not page or len(found) >= reply.get("total", 0):
            return found


async def read_subject(nc, stream: str, subject: str) -> list[bytes]:
    """Every message on one subject of a stream (a pull consumer, no acks)."""
    counts = await stream_subjects(nc, stream, subject)
    expected = counts.get(subject, 0)
    if not expected:
        return []
    js = nc.jetstream()
    info = await nc.jsm().add_consumer(stream, ConsumerConfig(
        ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, filter_subject=subject, mem_storage=True,
        inactive_threshold=60))
    try:
        sub = await js.pull_subscribe_bind(info.name, stream)
        got: list[bytes] = []
        while len(got) < expected:
            got.extend(m.data for m in await sub.fetch(min(1000, expected - len(got)), timeout=10))
        await sub.unsubscribe()
        return got
    finally:
        await nc.jsm().delete_consumer(stream, info.name)


def verify(datas: list[bytes], expected: collections.Counter, what: str) -> None:
    problems = []
    got: dict[tuple, int] = {}
    for data in datas:
        try:
            row = json.loads(data)
            key = (row["user"], row["start"])
            count = row["count"]
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"not a window row ({exc}): {data[:80]!r}")
            continue
        if key in got:
            problems.append(f"window {key} published twice ({got[key]} and {count})")
        got[key] = count
    problems += count_problems(got, expected, "windows")
    if problems:
        raise BenchError(f"{what}: output does not match the independent count ({len(datas)} rows, "
                         f"{sum(v for v in got.values() if isinstance(v, int))} events counted; "
                         f"{len(expected)} windows / {sum(expected.values())} events expected):\n  "
                         + "\n  ".join(problems[:20]))


# --------------------------------------------------------------------------- the cluster side


CHECKPOINT_RECORD = re.compile(r"app(\d+)\.cp(\d+)$")


class Observer:
    """Listens to every app's state events and to the checkpoint records the AppMasters
    put into the checkpoint KV bucket, so runs are timed by when the master published
    ACTIVE and SUCCEEDED, and every completed checkpoint is seen without asking anyone."""

    def __init__(self, client: Client):
        self.client = client
        self.states: dict[int, dict[str, float]] = collections.defaultdict(dict)
        self.ended: dict[int, asyncio.Event] = collections.defaultdict(asyncio.Event)
        #: app id -> checkpoint id -> (duration ms, size bytes, final)
        self.checkpoints: dict[int, dict[int, tuple[float, int, bool]]] = collections.defaultdict(dict)

    async def start(self) -> Observer:
        nc = self.client.bus.nc
        self.subs = [await nc.subscribe("app.*.state", cb=self._on_state),
                     await nc.subscribe(f"$KV.{bus_subjects.CHECKPOINT_BUCKET}.>", cb=self._on_record)]
        return self

    async def _on_state(self, msg) -> None:
        now = time.perf_counter()
        try:
            event = decode(msg.data, (ApplicationStateChanged,))
        except Exception:
            return
        self.states[event.app_id].setdefault(event.state, now)
        if event.state in AppState.TERMINAL:
            self.ended[event.app_id].set()

    async def _on_record(self, msg) -> None:
        """A completed checkpoint's record (CheckpointMeta as a dict), as the KV put
        publishes it; deletes (pruning) come without data."""
        found = CHECKPOINT_RECORD.search(msg.subject)
        if not found or not msg.data:
            return
        try:
            record = msgpack.unpackb(msg.data)
            self.checkpoints[int(found[1])][int(found[2])] = (record["duration_s"] * 1000, int(record["size_bytes"]),
                                                              bool(record.get("final")))
        except Exception:
            return

    async def run(self, args: list[str], config: dict, timeout: float):
        """Submit the app, wait for its end; (final summary, ACTIVE -> SUCCEEDED seconds,
        submit -> SUCCEEDED seconds)."""
        submitted = time.perf_counter()
        app_id = await self.client.submit(pack(APP), args, config=config)
        try:
            await asyncio.wait_for(self.ended[app_id].wait(), timeout)
        except TimeoutError:
            status = await self.client.status(app_id)
            await self.client.kill(app_id)
            raise BenchError(f"app {app_id} did not end within {timeout:g} s (state {status.state}, "
                             f"checkpoints {status.checkpoints})") from None
        summary = await self.client.wait(app_id, timeout=30)
        if summary.state != AppState.SUCCEEDED:
            raise BenchError(f"app {app_id} ended {summary.state}: {summary.error}")
        seen = self.states[app_id]
        ended = seen[AppState.SUCCEEDED]
        return summary, ended - seen.get(AppState.ACTIVE, submitted), ended - submitted


async def wait_workers(client: Client, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        info = await client.info()
        if sum(w.alive for w in info.workers) >= count:
            return
        await asyncio.sleep(0.2)
    raise BenchError(f"{count} workers did not register within {timeout:g} s")


# --------------------------------------------------------------------------- the raw reader


def raw_reader(url: str, subjects: list[str], expected: int, mode: str, batch: int, decode_json: bool, ready, go,
               results) -> None:
    """A process: one consumer over ``subjects`` (an ordered push consumer, or an ephemeral
    pull consumer fetching batches); reads ``expected`` messages once ``go`` is set; puts
    (messages, end wall time, error) on ``results``."""

    async def main():
        nc = await nats.connect(url, pending_size=64 << 20)
        try:
            js = nc.jetstream()
            ready.set()
            await asyncio.get_running_loop().run_in_executor(None, go.wait)
            loads = json.loads
            got = 0
            if mode == "ordered":
                done = asyncio.Event()

                async def on_msg(msg):
                    nonlocal got
                    if decode_json:
                        loads(msg.data)
                    got += 1
                    if got >= expected:
                        done.set()

                sub = await js.subscribe("", stream=STREAM, ordered_consumer=True, cb=on_msg,
                                         pending_msgs_limit=1_000_000, pending_bytes_limit=256 << 20,
                                         config=ConsumerConfig(filter_subjects=subjects))
                await asyncio.wait_for(done.wait(), 600)
                ended = time.time()
                await sub.unsubscribe()
                return got, ended
            info = await nc.jsm().add_consumer(STREAM, ConsumerConfig(
                ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL, filter_subjects=subjects,
                mem_storage=True, inactive_threshold=60))
            sub = await js.pull_subscribe_bind(info.name, STREAM, pending_msgs_limit=1_000_000)
            while got < expected:
                msgs = await sub.fetch(min(batch, expected - got), timeout=10)
                if decode_json:
                    for m in msgs:
                        loads(m.data)
                got += len(msgs)
            ended = time.time()
            await nc.jsm().delete_consumer(STREAM, info.name)
            return got, ended
        finally:
            await nc.close()

    try:
        got, ended = asyncio.run(main())
        results.put((got, ended, None))
    except BaseException as exc:  # noqa: BLE001 - reported to the parent
        ready.set()
        results.put((0, time.time(), f"{type(exc).__name__}: {exc}"))


async def run_raw(url: str, parallelism: int, mode: str, batch: int, decode_json: bool) -> tuple[int, float]:
    """P reader processes over the subjects the P source tasks own; (messages, seconds)."""
    nc = await nats.connect(url)
    try:
        counts = await stream_subjects(nc, STREAM, f"{SUBJECT_PREFIX}.*")
    finally:
        await nc.close()
    every = sorted(counts)
    ctx = multiprocessing.get_context("spawn")
    go, results = ctx.Event(), ctx.Queue()
    procs, readies = [], []
    for i in range(parallelism):
        owned = every[i::parallelism]
        if not owned:
            continue
        ready = ctx.Event()
        p = ctx.Process(target=raw_reader, args=(url, owned, sum(counts[s] for s in owned), mode, batch, decode_json,
                                                   ready, go, results), daemon=True)
        p.start()
        procs.append(p)
        readies.append(ready)
    loop = asyncio.get_running_loop()
    for ready in readies:
        if not await loop.run_in_executor(None, ready.wait, 60):
            raise BenchError("a raw reader did not connect within 60 s")
    started = time.time()
    go.set()
    outcomes = [await loop.run_in_executor(None, results.get, True, 600) for _ in procs]
    for p in procs:
        p.join(10)
    errors = [e for _, _, e in outcomes if e]
    if errors:
        raise BenchError(f"raw reader failed: {errors[0]}")
    return sum(n for n, _, _ in outcomes), max(t for _, t, _ in outcomes) - started


# --------------------------------------------------------------------------- report


def _loadavg() -> str:
    try:
        return "/".join(f"{x:.2f}" for x in os.getloadavg())
    except (AttributeError, OSError):
        return "n/a"


def summarize(samples: list[float], higher_is_better: bool) -> tuple[float | None, float | None]:
    if not samples:
        return None, None
    return statistics.median(samples), (max(samples) if higher_is_better else min(samples))


def _fmt(value, unit: str) -> str:
    if value is None:
        return "-"
    if unit in ("events/s", "bytes"):
        return f"{value:,.0f}"
    if unit in ("ms", "count"):
        return f"{value:,.1f}" if value != int(value) else f"{int(value):,}"
    return f"{value:.3f}"


def print_table(title: str, rows: list[tuple]) -> None:
    header = ("measure", "median", "best", "unit", "goal")
    cells = [header] + [(label, _fmt(med, unit), _fmt(best, unit), unit, goal)
                        for label, med, best, unit, goal in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    print()
    print(title)
    for j, row in enumerate(cells):
        print("  ".join(c.ljust(w) if i in (0, 3, 4) else c.rjust(w)
                        for i, (c, w) in enumerate(zip(row, widths))).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))


# --------------------------------------------------------------------------- main


async def bench(opts, tmp: str) -> int:
    load_before = _loadavg()
    store = os.path.join(tmp, "jetstream")
    os.makedirs(store)
    server = NatsServer(store_dir=store, log_path=os.path.join(tmp, "nats-server.log"))
    server.start()
    cluster = LocalCluster(workers=opts.workers, slots=opts.slots, log_dir=os.path.join(tmp, "logs"), nats=server)
    try:
        cluster.start()
        expected = await fill(server.url, opts)
        async with Client(server.url, timeout=30) as client:
            await wait_workers(client, opts.workers)
            observer = await Observer(client).start()
            rates = {0: [], opts.interval_ms: []}
            wholes = {0: [], opts.interval_ms: []}
            cp_runs: list[dict] = []
            run = 0
            for r in range(opts.repeat):
                for interval in (0, opts.interval_ms) if r % 2 == 0 else (opts.interval_ms, 0):
                    run += 1
                    subject = f"{OUT_PREFIX}.{run}"
                    args = ["--stream", STREAM, "--mode", "window", "--windows-subject", subject,
                            "--window-ms", str(opts.window_ms), "--parallelism", str(opts.parallelism)]
                    summary, running, whole = await observer.run(args, {"checkpoint_interval_ms": interval},
                                                                 opts.timeout)
                    rates[interval].append(opts.events / running)
                    wholes[interval].append(opts.events / whole)
                    nc = client.bus.nc
                    verify(await read_subject(nc, OUT_STREAM, subject), expected,
                           f"window run {run} (checkpoint_interval_ms={interval})")
                    cp = summary.checkpoints
                    records = observer.checkpoints[summary.app_id]
                    if interval:
                        periodic = [v for v in records.values() if not v[2]]
                        cp_runs.append({"completed": cp.completed, "failed": cp.failed,
                                        "durations": [d for d, _, _ in periodic],
                                        "sizes": [s for _, s, _ in periodic],
                                        "last_duration": cp.last_duration_ms, "last_size": cp.last_size_bytes})
                    log(f"window run {run}: checkpoint_interval_ms={interval}: ACTIVE -> SUCCEEDED {running:.3f} s, "
                        f"{opts.events / running:,.0f} events/s (submit -> SUCCEEDED {whole:.3f} s); checkpoints completed {cp.completed}, "
                        f"failed {cp.failed}, last {cp.last_duration_ms} ms / {cp.last_size_bytes:,} B "
                        f"({len(records)} records seen); output verified ({len(expected):,} windows)")

            source_rates, raw_rates = [], []
            if opts.source:
                for r in range(opts.repeat):
                    for which in ("source", "raw") if r % 2 == 0 else ("raw", "source"):
                        if which == "source":
                            args = ["--stream", STREAM, "--mode", "source", "--parallelism", str(opts.parallelism)]
                            summary, running, whole = await observer.run(
                                args, {"checkpoint_interval_ms": opts.interval_ms}, opts.timeout)
                            read = sum(t.records_in for t in summary.tasks if t.task.processor == 0)
                            source_rates.append(opts.events / running)
                            log(f"source alone {r + 1}/{opts.repeat}: {running:.3f} s (submit -> {whole:.3f} s), "
                                f"{source_rates[-1]:,.0f} events/s ({read:,} records counted into the source "
                                f"processor's tasks)")
                        else:
                            got, secs = await run_raw(server.url, opts.parallelism, opts.raw_mode, opts.raw_batch,
                                                           opts.raw_decode)
                            if got != opts.events:
                                raise BenchError(f"the raw reader read {got} messages, {opts.events} in the stream")
                            raw_rates.append(got / secs)
                            log(f"raw nats-py {r + 1}/{opts.repeat}: {secs:.3f} s, {raw_rates[-1]:,.0f} events/s")
    finally:
        cluster.stop()
        server.stop()

    off, on = rates[0], rates[opts.interval_ms]
    rows = []

    def add(label, samples, higher, unit, goal=""):
        med, best = summarize(samples, higher)
        rows.append((label, med, best, unit, goal))

    def ratio(label, num, den, goal=""):
        (nm, nb), (dm, db) = summarize(num, True), summarize(den, True)
        rows.append((label, nm / dm if nm and dm else None, nb / db if nb and db else None, "x", goal))

    add("windowed, checkpoints off (interval 0)", off, True, "events/s")
    add(f"windowed, checkpoints every {opts.interval_ms} ms", on, True, "events/s")
    ratio("ratio checkpointed / off", on, off, f">= {TARGET_RATIO} (Quix: >= {QUIX_RATIO})")
    add("windowed, checkpoints off, submit -> SUCCEEDED", wholes[0], True, "events/s")
    add(f"windowed, every {opts.interval_ms} ms, submit -> SUCCEEDED", wholes[opts.interval_ms], True, "events/s")
    ratio("ratio checkpointed / off, submit -> SUCCEEDED", wholes[opts.interval_ms], wholes[0])
    add("checkpoints completed per run", [c["completed"] for c in cp_runs], True, "count")
    add("checkpoints failed per run", [c["failed"] for c in cp_runs], False, "count")
    durations = [d for c in cp_runs for d in c["durations"]]
    sizes = [s for c in cp_runs for s in c["sizes"]]
    add(f"periodic checkpoint duration ({len(durations)} seen)", durations, False, "ms")
    rows.append(("periodic checkpoint duration, max", max(durations) if durations else None, None, "ms", ""))
    add("periodic checkpoint size", sizes, False, "bytes")
    add("last checkpoint duration (the final one)", [c["last_duration"] for c in cp_runs], False, "ms")
    add("last checkpoint size", [c["last_size"] for c in cp_runs], False, "bytes")
    if opts.source:
        add(f"source alone, {opts.parallelism} tasks (filter drops all)", source_rates, True, "events/s")
        add(f"raw nats-py, {opts.parallelism} reader processes", raw_rates, True, "events/s")
        ratio("ratio source alone / raw nats-py", source_rates, raw_rates)
        ratio("ratio source alone / windowed (checkpointed)", source_rates, on, "> 1: source not the bottleneck")

    print_table(f"checkpoints: {opts.events:,} events over {opts.subjects} subjects, {opts.users} users, "
                f"{opts.window_ms} ms tumbling windows, parallelism {opts.parallelism}, seed {opts.seed}, "
                f"repeat {opts.repeat}", rows)
    print(f"{os.cpu_count()} CPUs; load average {load_before} before, {_loadavg()} after")
    raw = ("an ordered push consumer" if opts.raw_mode == "ordered"
           else f"a pull consumer fetching batches of {opts.raw_batch}")
    print("events/s = events / (ACTIVE -> SUCCEEDED), as the master published them (tasks may start reading "
          "a little before ACTIVE); 'submit ->' rows time from submit (executor launch included). "
          "Checkpoint figures: every completed checkpoint's record (as put into the checkpoint KV bucket) and "
          "the app's final status.")
    print(f"raw reader: per process {raw} over the subjects of one source task, JSON "
          f"{'decoded' if opts.raw_decode else 'not decoded'}, timed from go (consumer creation included) to the "
          "last message; connecting and process start-up not included")
    on_m, off_m = summarize(on, True)[0], summarize(off, True)[0]
    verdicts = [f"checkpointed / off {on_m / off_m:.3f}: "
                + ("meets goal" if on_m / off_m >= TARGET_RATIO else "BELOW goal")]
    if opts.source:
        src = summarize(source_rates, True)[0]
        verdicts.append(f"source alone / windowed {src / on_m:.2f}: "
                        + ("source is not the bottleneck" if src > on_m * 1.2 else "source may be the bottleneck"))
    print("verdict (medians): " + "; ".join(verdicts))
    print(f"window output verified against the independent count on every run ({len(expected):,} windows)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--events", type=int, default=500_000, help="events in the stream")
    parser.add_argument("--users", type=int, default=100, help="distinct keys")
    parser.add_argument("--subjects", type=int, default=4, help="subjects of the input stream")
    parser.add_argument("--window-ms", type=int, default=10_000, help="tumbling window size (event time; "
                        "events are 1 ms apart)")
    parser.add_argument("--interval-ms", type=int, default=1000, help="checkpoint interval of the checkpointed runs")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    parser.add_argument("--parallelism", type=int, default=2, help="tasks per step and executors")
    parser.add_argument("--workers", type=int, default=2, help="workers of the embedded cluster")
    parser.add_argument("--slots", type=int, default=4, help="slots per worker")
    parser.add_argument("--seed", type=int, default=42, help="seed of the generated events")
    parser.add_argument("--source", action=argparse.BooleanOptionalAction, default=True,
                        help="also measure the source alone beside a raw nats-py reader")
    parser.add_argument("--raw-mode", choices=("ordered", "pull"), default="ordered",
                        help="raw reader: an ordered push consumer (nats-py's fastest path) or a pull consumer "
                        "fetching batches (about 4x slower in nats-py 2.16)")
    parser.add_argument("--raw-batch", type=int, default=1000, help="raw reader's fetch batch (--raw-mode pull)")
    parser.add_argument("--raw-decode", action=argparse.BooleanOptionalAction, default=True,
                        help="raw reader decodes each event's JSON (as the source does)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds allowed per app run")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (logs, store)")
    opts = parser.parse_args(argv)
    for name in ("events", "users", "subjects", "window_ms", "interval_ms", "repeat", "parallelism", "workers",
                 "slots", "raw_batch"):
        if getattr(opts, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return in_temp_dir("gearbus-checkpoints-", opts.keep, lambda tmp: asyncio.run(bench(opts, tmp)))


if __name__ == "__main__":
    sys.exit(main())
