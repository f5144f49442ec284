"""Checkpoints of large keyed state: incremental snapshots beside whole ones, in one run.

    python bench/state.py [--keys 1000000] [--seconds 40] [--interval-ms 1000]
                          [--parallelism 2] [--rate 1000000000] [--timeout 600] [--keep]
                          [--backend memory|rocksdb]
    python bench/state.py --store-seconds 600 [--keys 1000000] [--rate 200000]
    python bench/state.py --kill-trials 3 [--keys 10000000] [--seconds 20]
    python bench/state.py --app examples/nexmark/q5.py --app-args "--rate 20000 --blackhole"

A keyed running count (bench/state_app.py: a generator source of ``n * 7919 % KEYS`` ->
group_by -> stateful_map count -> a discarding sink) runs for ``--seconds`` on an embedded
cluster (a nats-server with a file store, a master, two workers), three times:

* ``incremental``: checkpoints every INTERVAL, snapshots holding the keys changed since the
  last completed checkpoint (the default);
* ``baseline``: the same with ``incremental_checkpoints: false``, every snapshot whole (how
  gearbus checkpointed before);
* ``off``: checkpoints off (periodic ones; nothing completes while it runs).

With ``--copies-baseline`` the baseline is instead incremental checkpoints without local
copies (``local_copies: false``): with ``--backend rocksdb``, what keeping a copy of the
state on disk at each checkpoint costs the checkpoints and the events/s.

Each run is measured from when the counting step holds every key (the state as large as it
gets; a fill at full speed takes about KEYS / 170,000 s here), for ``--seconds``. For each:
the events counted per second (the records the counting processor took in over the
measured time), the keys held at the end, and from the AppMaster's history of the last 20
checkpoints (``gearbus status --json``), those triggered in the measured time: the duration
p50/p99 (of at most 20 per run: the slowest), the longest barrier
alignment p50 (the time a barrier waited for its siblings: queueing, not snapshotting) and
the bytes written p50 of the completed ones, with how many completed and failed. Ratios: incremental / baseline
checkpoint duration and bytes, and throughput with checkpoints (each mode) / off. Every
mode keeps its state in ``--backend``; the executors' resident memory is sampled every
second, and the largest is printed (and the AppMaster's, which compacts), split into heap (anonymous) and file-backed pages
(mapped files, and the page cache the kernel reclaims under pressure). The cores each
role kept busy over the measured time (CPU seconds / seconds: the executors together, the
AppMaster, which compacts checkpoints, and the nats-server, which stores them) say where a
checkpoint's cost lands on a machine the roles share.

The modes run ``--rounds`` times (2 by default), in turn forward and backward, so a
machine that speeds up or slows down over the minutes favours none of them: events/s are
the mean of a mode's runs (each run's are printed as it ends: on a shared 2-core machine
they vary by a fifth between runs), the checkpoint figures are over all of its runs'
checkpoints, the memory is the largest.

``--kill-trials N`` instead runs the incremental mode alone: once it holds every key, N
times (``--seconds`` apart) an executor is SIGKILLed, and the seconds from the kill until
a checkpoint triggered after it completes are printed: the time until the app commits
output again (a transactional sink publishes at each completed checkpoint), restore of
every task's state included. The completion is timed by the checkpoint's own record
(trigger + duration); the status shows it up to an AppMaster heartbeat (1 s) later, and
that time is printed beside it. Exactness through such kills is the chaos tests'.

``--store-seconds S`` instead runs the incremental mode alone for S seconds and samples,
every 10 s, the bytes the app's checkpoint object store holds (its JetStream stream: every
kept snapshot, whole, incremental or compacted, and the chunks of any object being
replaced), beside the size of one whole snapshot of the state then (each task's largest
object in the store: the whole snapshot its chain starts from; the counting step's
``state_bytes``, its pickled size estimated from a sample, is printed beside it as each
sample is taken) as a ratio: what pruning and
compaction keep stored over a long run.
``--app PATH --app-args "..."`` runs another app in the same three modes instead (the
checkpoint interval and ``--backend`` still apply; ``--keys``, ``--rate`` and
``--parallelism`` do not): the Nexmark queries hold their state in windows and joins.
Its events/s are the records taken in by its busiest stateful processor.
This is a benchmark, not a test: it fails only when a run does.
"""

from __future__ import annotations

import asyncio
import statistics
import os
import signal
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from common import BenchError, embedded_cluster, in_temp_dir, parser_from_doc  # noqa: E402  (bench/, beside this file)
from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from gearbus.natsserver import NatsServer  # noqa: E402
from shared import subjects  # noqa: E402
from shared.messages import AppState  # noqa: E402

APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "state_app.py")
NAN = float("nan")
#: The processes whose CPU time a run reports: the app's, and the nats-server storing its checkpoints.
ROLES = ("executor", "appmaster", "nats-server")
MODES = {"incremental": {"incremental_checkpoints": True}, "baseline": {"incremental_checkpoints": False},
         "off": {"checkpoint_interval_ms": 0}}
#: ``--copies-baseline``: the baseline is incremental checkpoints without local copies.
NO_COPIES = {"incremental_checkpoints": True, "local_copies": False}


async def submit(client: Client, opts, config: dict) -> int:
    """The counting app, checkpointing every ``--interval-ms`` unless ``config`` says otherwise."""
    args = opts.app_args.split() if opts.app else ["--keys", str(opts.keys), "--rate", str(opts.rate),
                                                   "--parallelism", str(opts.parallelism)]
    return await client.submit(pack(opts.app or APP), args,
                               config={"checkpoint_interval_ms": opts.interval_ms, "state_backend": opts.backend,
                                       **config})


def largest_memory(cluster: LocalCluster, role: str) -> dict[str, int]:
    """The resident memory now of the largest process of ``role`` ("executor" or
    "appmaster"), and its heap and file-backed parts (bytes)."""
    largest = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}
    for pid, _, kind in cluster.processes():
        found = {}
        try:
            with open(f"/proc/{pid}/status") as status:
                for line in status:
                    name, _, value = line.partition(":")
                    if name in largest:
                        found[name] = int(value.split()[0]) * 1024
        except OSError:
            continue
        if kind == role and found.get("VmRSS", 0) > largest["VmRSS"]:
            largest.update(found)
    return largest


def cpu_seconds(cluster: LocalCluster, server: NatsServer) -> dict[int, tuple[str, float]]:
    """Each app process's and the nats-server's CPU time so far (user + system), by pid."""
    processes = [(pid, kind) for pid, _, kind in cluster.processes()] + [(server.process.pid, "nats-server")]
    found = {}
    for pid, kind in processes:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rpartition(")")[2].split()
        except OSError:
            continue
        found[pid] = (kind, (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return found


def cores_by_role(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                  elapsed: float) -> dict[str, float]:
    """The cores each role kept busy between two :func:`cpu_seconds` samples."""
    cores: dict[str, float] = dict.fromkeys(ROLES, 0.0)
    for pid, (kind, seconds) in after.items():
        cores[kind] += (seconds - before.get(pid, (kind, 0.0))[1]) / elapsed
    return cores


async def warmed_up(client: Client, app_id: int, mode: str, opts):
    """The app's status once it runs holding every key (see :func:`warm`)."""
    deadline = time.monotonic() + opts.timeout
    while (status := await client.status(app_id)).state != AppState.ACTIVE or not warm(status, opts):
        if status.state in AppState.TERMINAL or time.monotonic() > deadline:
            raise BenchError(f"{mode}: the app is {status.state}: {status.error}")
        await asyncio.sleep(0.2)
    return status


async def run_mode(client: Client, cluster: LocalCluster, server: NatsServer, mode: str, opts) -> dict:
    """One run of the app in ``mode``: its figures."""
    app_id = await submit(client, opts, NO_COPIES if mode == "baseline" and opts.copies_baseline else MODES[mode])
    status = await warmed_up(client, app_id, mode, opts)
    started, counted_at_start, started_ms = time.monotonic(), counted(status), time.time() * 1000
    cpu_at_start = cpu_seconds(cluster, server)
    memory, appmaster = largest_memory(cluster, "executor"), 0
    while time.monotonic() - started < opts.seconds:
        await asyncio.sleep(1)
        memory = max(memory, largest_memory(cluster, "executor"), key=lambda sample: sample["VmRSS"])
        appmaster = max(appmaster, largest_memory(cluster, "appmaster")["VmRSS"])
    status = await client.status(app_id)
    elapsed = time.monotonic() - started
    cores = cores_by_role(cpu_at_start, cpu_seconds(cluster, server), elapsed)
    if status.state != AppState.ACTIVE:
        raise BenchError(f"{mode}: the app is {status.state}: {status.error}")
    await client.kill(app_id)
    measured = [c for c in (status.checkpoints.history if status.checkpoints else []) if c.trigger_ms >= started_ms]
    history = [c for c in measured if c.status == "completed"]
    failed = sum(1 for c in measured if c.status == "failed")
    durations = [c.duration_ms / 1000 for c in history]
    alignments = [c.alignment_ms / 1000 for c in history]
    sizes = [c.size_bytes for c in history]
    return {"rate": (counted(status) - counted_at_start) / elapsed, "keys": sum(p.state_keys for p in status.processors),
            "completed": len(history), "failed": failed, "durations": durations, "alignments": alignments,
            "sizes": sizes, "rss": memory["VmRSS"], "heap": memory["RssAnon"], "file": memory["RssFile"],
            "appmaster_rss": appmaster, "cores": cores}


def merged(runs: list[dict]) -> dict:
    """A mode's figures over its rounds: the mean rate, the checkpoints of every round
    together, the largest memory."""
    durations = [d for run in runs for d in run["durations"]]
    return {"rate": statistics.mean(run["rate"] for run in runs), "keys": runs[-1]["keys"],
            "completed": sum(run["completed"] for run in runs), "failed": sum(run["failed"] for run in runs),
            "p50": median(durations), "p99": max(durations, default=NAN),
            "alignment": median([a for run in runs for a in run["alignments"]]),
            "bytes": median([s for run in runs for s in run["sizes"]]),
            **{key: max(run[key] for run in runs) for key in ("rss", "heap", "file", "appmaster_rss")},
            "cores": {role: statistics.mean(run["cores"][role] for run in runs) for role in ROLES}}


def warm(status, opts) -> bool:
    """Whether the measuring may start: the counting app holds every key (its state is
    as large as it gets; checkpoints taken while it fills say little); another app at once."""
    return bool(opts.app) or sum(p.state_keys for p in status.processors) >= opts.keys


def median(values: list[float]) -> float:
    return statistics.median(values) if values else NAN


def counted(status) -> int:
    """Records the processor holding the counts took in."""
    return max((p.records_in for p in status.processors if p.state_keys), default=0)


async def kill_run(client: Client, cluster: LocalCluster, opts) -> list[float]:
    """``--kill-trials N``: the incremental mode, holding every key; N times, an executor
    is SIGKILLed ``--seconds`` after the app last checkpointed again, and the seconds from
    the kill until a checkpoint triggered after it completes (committed output again: what
    a transactional sink publishes) are taken."""
    app_id = await submit(client, opts, {})
    status = await warmed_up(client, app_id, "kill", opts)
    taken = []
    for trial in range(opts.kill_trials):
        await asyncio.sleep(opts.seconds)
        victim = next(pid for pid, _, kind in cluster.processes() if kind == "executor")
        killed, killed_ms = time.monotonic(), time.time() * 1000
        os.kill(victim, signal.SIGKILL)
        while (committed_ms := committed_since(status := await client.status(app_id), killed_ms)) is None:
            if status.state in AppState.TERMINAL or time.monotonic() - killed > opts.timeout:
                raise BenchError(f"trial {trial + 1}: the app is {status.state}: {status.error}")
            await asyncio.sleep(0.05)
        taken.append((committed_ms - killed_ms) / 1000)
        print(f"trial {trial + 1}: committed again {taken[-1]:.2f} s after the kill (seen in the status after "
              f"{time.monotonic() - killed:.2f} s; {status.restarts} restarts, "
              f"{sum(p.state_keys for p in status.processors):,} keys)", file=sys.stderr, flush=True)
    await client.kill(app_id)
    return taken


def committed_since(status, ms: float) -> float | None:
    """When (epoch ms) the first checkpoint triggered after ``ms`` completed, by its own
    record (trigger + duration), or None: the status, reported with the AppMaster's
    heartbeat, shows it up to a heartbeat later."""
    history = status.checkpoints.history if status.checkpoints else []
    return min((c.trigger_ms + c.duration_ms for c in history if c.status == "completed" and c.trigger_ms > ms),
               default=None)


async def store_run(client: Client, opts) -> list[tuple[float, int, int, int]]:
    """The incremental mode for ``--store-seconds``: every 10 s, (seconds, store bytes,
    one whole snapshot's bytes, checkpoints completed)."""
    app_id = await submit(client, opts, {})
    started, samples = time.monotonic(), []
    while time.monotonic() - started < opts.store_seconds:
        await asyncio.sleep(10)
        status = await client.status(app_id)
        if status.state in AppState.TERMINAL:
            raise BenchError(f"the app is {status.state}: {status.error}")
        info = await client.bus.js.stream_info(f"OBJ_{subjects.snapshot_bucket(app_id)}")
        whole = await whole_snapshot_bytes(client, app_id)
        samples.append((time.monotonic() - started, info.state.bytes, whole,
                        status.checkpoints.completed if status.checkpoints else 0))
        print(f"{samples[-1][0]:7.0f} s  store {info.state.bytes:>14,} bytes  whole snapshot {whole:>14,} bytes  "
              f"(estimated {sum(p.state_bytes for p in status.processors):,})  {samples[-1][3]} checkpoints",
              file=sys.stderr, flush=True)
    await client.kill(app_id)
    return samples


async def whole_snapshot_bytes(client: Client, app_id: int) -> int:
    """One whole snapshot of the app as stored: the largest object each task has in the
    store (the whole snapshot its chain starts from outweighs any of its changes), summed."""
    store = await client.bus.js.object_store(subjects.snapshot_bucket(app_id))
    largest: dict[str, int] = {}
    for info in await store.list():
        task = info.name.rsplit("/", 1)[-1]
        largest[task] = max(largest.get(task, 0), info.size or 0)
    return sum(largest.values())


async def bench(opts, tmp: str) -> int:
    with embedded_cluster(tmp) as (server, cluster):
        async with Client(server.url, timeout=60) as client:
            if opts.store_seconds:
                samples = await store_run(client, opts)
            elif opts.kill_trials:
                kills = await kill_run(client, cluster, opts)
            else:
                runs: dict[str, list[dict]] = {mode: [] for mode in opts.modes}
                for round_ in range(opts.rounds):
                    for mode in (opts.modes if round_ % 2 == 0 else opts.modes[::-1]):
                        print(f"round {round_ + 1}: running {mode} for {opts.seconds:g} s ...", file=sys.stderr,
                              flush=True)
                        runs[mode].append(await run_mode(client, cluster, server, mode, opts))
                        print(f"  {runs[mode][-1]['rate']:,.0f} events/s", file=sys.stderr, flush=True)
                results = {mode: merged(mode_runs) for mode, mode_runs in runs.items()}
    if opts.store_seconds:
        print_store(samples, opts)
    elif opts.kill_trials:
        print(f"executor SIGKILL with a keyed running count over {opts.keys:,} keys, checkpoints every "
              f"{opts.interval_ms} ms, state backend {opts.backend}: seconds from the kill until a checkpoint "
              f"triggered after it completes, over {len(kills)} trials")
        print(f"p50 {statistics.median(kills):.2f}  max {max(kills):.2f}  (each: "
              f"{', '.join(f'{k:.2f}' for k in kills)})")
    else:
        print_table(results, opts)
    return 0


def print_store(samples: list[tuple[float, int, int, int]], opts) -> None:
    """The store's size over one whole snapshot's, at its largest and at the end."""
    print(f"checkpoint store of a keyed running count over {opts.keys:,} keys, incremental checkpoints every "
          f"{opts.interval_ms} ms, {opts.store_seconds:g} s, sampled every 10 s")
    print(f"{'':26}{'at':>8}{'store bytes':>16}{'one whole snapshot':>20}{'ratio':>8}")
    largest = max(samples, key=lambda sample: sample[1] / max(sample[2], 1))
    for label, (at, store, whole, _) in (("largest ratio", largest), ("last sample", samples[-1])):
        print(f"{label:26}{at:>7.0f}s{store:>16,}{whole:>20,}{store / max(whole, 1):>8.2f}")
    print(f"{'checkpoints completed':26}{samples[-1][3]:>8,}")


def not_run() -> dict:
    """The figures of a mode left out (``--modes``): all NaN."""
    return {"rate": NAN, "keys": 0, "completed": 0, "failed": 0, "p50": NAN, "p99": NAN, "alignment": NAN,
            "bytes": NAN, "rss": NAN, "heap": NAN, "file": NAN, "appmaster_rss": NAN, "cores": dict.fromkeys(ROLES, NAN)}


def print_table(results: dict, opts) -> None:
    inc, base, off = (results.get(mode) or not_run() for mode in MODES)
    what = f"{opts.app} {opts.app_args}" if opts.app else \
        f"keyed running count over {opts.keys:,} keys, parallelism {opts.parallelism}"
    print(f"{what}, checkpoints every {opts.interval_ms} ms, {opts.seconds:g} s per run, {opts.rounds} round(s), "
          f"state backend {opts.backend}")
    print(f"{'':34}{'incremental':>14}{'no copies' if opts.copies_baseline else 'baseline':>14}{'ratio':>9}")
    rows = [("checkpoint duration p50 (s)", "p50", "{:.3f}"), ("checkpoint duration p99 (s)", "p99", "{:.3f}"),
            ("longest alignment p50 (s)", "alignment", "{:.3f}"), ("bytes per checkpoint p50", "bytes", "{:,.0f}")]
    for label, key, fmt in rows:
        ratio = inc[key] / base[key] if base[key] else float("nan")
        print(f"{label:34}{fmt.format(inc[key]):>14}{fmt.format(base[key]):>14}{ratio:>9.2f}")
    done = {mode: f"{figures['completed']} / {figures['failed']}" for mode, figures in (("incremental", inc),
                                                                                           ("baseline", base))}
    print(f"{'checkpoints completed / failed':34}{done['incremental']:>14}{done['baseline']:>14}")
    print(f"{'keys held at the end':34}{inc['keys']:>14,}{base['keys']:>14,}")
    print(f"{'events/s':34}{inc['rate']:>14,.0f}{base['rate']:>14,.0f}{inc['rate'] / base['rate']:>9.2f}")
    print(f"{'events/s, checkpoints off':34}{off['rate']:>14,.0f}")
    print(f"{'events/s with / off':34}{inc['rate'] / off['rate']:>14.2f}{base['rate'] / off['rate']:>14.2f}")
    for label, key in (("largest executor RSS (MiB)", "rss"), ("  of it heap (MiB)", "heap"),
                       ("  of it file-backed (MiB)", "file"), ("largest AppMaster RSS (MiB)", "appmaster_rss")):
        print(f"{label:34}{inc[key] / 2**20:>14,.0f}{base[key] / 2**20:>14,.0f}{'':>9}{off[key] / 2**20:>10,.0f} off")
    for role in ROLES:
        label = f"cores busy: {role}s" if role != "nats-server" else "cores busy: nats-server"
        print(f"{label:34}{inc['cores'][role]:>14.2f}{base['cores'][role]:>14.2f}{'':>9}"
              f"{off['cores'][role]:>10.2f} off")


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    parser.add_argument("--seconds", type=float, default=40.0, help="running time of each run")
    parser.add_argument("--interval-ms", type=int, default=1000, help="checkpoint interval")
    parser.add_argument("--parallelism", type=int, default=2, help="tasks per step")
    parser.add_argument("--rate", type=float, default=1e9, help="the source's events/s (the default: flat out)")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each app to start")
    parser.add_argument("--rounds", type=int, default=2,
                        help="run the modes this many times, in turn forward and backward (figures merged)")
    parser.add_argument("--modes", type=lambda text: [mode for mode in text.split(",") if mode],
                        default=list(MODES), help=f"the modes to run, of {','.join(MODES)} (figures of the others: nan)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (logs, store)")
    parser.add_argument("--copies-baseline", action="store_true",
                        help="the baseline: incremental checkpoints without local copies (local_copies: false), "
                             "what keeping a copy of the state on disk at each checkpoint costs")
    parser.add_argument("--backend", choices=("memory", "rocksdb"), default="memory",
                        help="the state backend of every run")
    parser.add_argument("--app", default="", help="run this app instead of the keyed count")
    parser.add_argument("--app-args", default="", help="its arguments, as one string")
    parser.add_argument("--kill-trials", type=int, default=0,
                        help="kill an executor this many times instead, timing committed output again")
    parser.add_argument("--store-seconds", type=float, default=0.0,
                        help="run the incremental mode alone this long, sampling the checkpoint store's size")
    opts = parser.parse_args(argv)
    if opts.keys < 1 or opts.seconds <= 0 or opts.interval_ms < 1 or opts.parallelism < 1 or opts.rounds < 1:
        parser.error("--keys, --seconds, --interval-ms, --parallelism and --rounds must be positive")
    if not opts.modes or set(opts.modes) - set(MODES):
        parser.error(f"--modes takes some of {','.join(MODES)}, comma-separated")
    return in_temp_dir("gearbus-state-", opts.keep, lambda tmp: asyncio.run(bench(opts, tmp)))


if __name__ == "__main__":
    sys.exit(main())
