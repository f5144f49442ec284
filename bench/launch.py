"""What a worker's fork server saves: an executor launched by forking a pre-imported
interpreter against one started as a fresh ``python -m services.executor``, on the same
machine, in one run, the two sides interleaved.

(a) one cluster with two workers, one forking (the default) and one with
``--no-fork-server``: each round sends LaunchExecutor for a streaming executor (the
WordCount example as its app) to each worker in turn, and measures the wall time until
the executor's RegisterExecutor arrives and the CPU time the process has used by then
(/proc/PID/stat); the executor is then killed and its ExecutorStopped awaited. (b) the wall
time of integration test files run whole, with ``$GEARBUS_NO_FORK_SERVER`` unset and set,
in turn. Medians are printed with each side's figures and the ratio.

    python bench/launch.py                                   # 20 launches each, then the two test files once each way
    python bench/launch.py --launches 40 --test-runs 0       # launches only
    python bench/launch.py --test-files tests/integration/test_wakeups.py --test-runs 3
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import REPO, BenchError, parser_from_doc  # noqa: E402  (bench/, beside this file)

from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster, children_of, role_of  # noqa: E402
from services.worker.launcher import NO_FORK_SERVER_ENV  # noqa: E402
from shared import digests, subjects  # noqa: E402
from shared.messages import (  # noqa: E402
    ExecutorKind,
    ExecutorLaunched,
    ExecutorStopped,
    LaunchExecutor,
    RegisterExecutor,
    ShutdownExecutor,
    decode,
)

SIDES = {"fork server": "forking", "fresh interpreter": "plain"}  # side -> worker id
TICKS = os.sysconf("SC_CLK_TCK")
TIMEOUT_S = 60.0


def cpu_s(pid: int) -> float:
    """User plus system CPU time a live process has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def start_cluster(log_dir: str) -> LocalCluster:
    cluster = LocalCluster(workers=0, slots=2, log_dir=log_dir).start()
    cluster.start_worker(SIDES["fork server"])
    os.environ[NO_FORK_SERVER_ENV] = "1"  # read by the worker started next (LocalCluster passes its environment)
    try:
        cluster.start_worker(SIDES["fresh interpreter"])
    finally:
        del os.environ[NO_FORK_SERVER_ENV]
    return cluster


async def launch_once(client: Client, worker_id: str, app_id: int, artifact, app_args: list[str]) -> tuple[float, float]:
    """(seconds from LaunchExecutor to RegisterExecutor, CPU seconds of the process by then)."""
    registered: asyncio.Future = asyncio.get_running_loop().create_future()
    stopped = asyncio.Event()

    async def on_register(msg):
        if not registered.done():
            registered.set_result((time.monotonic(), decode(msg.data, (RegisterExecutor,)).pid))

    async def on_stopped(msg):
        report = decode(msg.data, (ExecutorStopped,))
        if report.app_id == app_id:
            stopped.set()
            if not registered.done():
                registered.set_exception(BenchError(f"the executor ended before it registered: {report.exit_detail()}"))

    nc = client.bus.nc
    subs = [await nc.subscribe(subjects.appmaster_executor_register(app_id), cb=on_register),
            await nc.subscribe(subjects.EXECUTOR_STOPPED, cb=on_stopped)]
    launch = LaunchExecutor(app_id, 0, ExecutorKind.EXECUTOR, artifact.name, artifact.entry, artifact.kind,
                            app_args,
                            artifact_digest=digests.sha256_hex(artifact.data))
    try:
        start = time.monotonic()
        await client.bus.request(subjects.worker_launch(worker_id), launch, TIMEOUT_S, expect=ExecutorLaunched)
        at, pid = await asyncio.wait_for(registered, TIMEOUT_S)
        cpu = cpu_s(pid)
        await client.bus.publish(subjects.worker_shutdown(worker_id, app_id),
                                 ShutdownExecutor(app_id, 0, reason="benchmark", force=True))
        await asyncio.wait_for(stopped.wait(), TIMEOUT_S)
        return at - start, cpu
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def measure_launches(url: str, launches: int, scratch: str) -> dict[str, list[tuple[float, float]]]:
    figures: dict[str, list[tuple[float, float]]] = {side: [] for side in SIDES}
    artifact = pack(os.path.join(REPO, "examples", "wordcount.py"))
    text = os.path.join(scratch, "input.txt")
    with open(text, "w") as f:
        f.write("a few words\n")
    app_args = ["--input", text, "--output", os.path.join(scratch, "counts.jsonl")]
    async with Client(url, timeout=TIMEOUT_S) as client:
        await client.upload(artifact)
        for n in range(launches):
            order = list(SIDES) if n % 2 == 0 else list(reversed(SIDES))
            for side in order:
                figures[side].append(await launch_once(client, SIDES[side], 10_000 + 2 * n + order.index(side),
                                                       artifact, app_args))
            progress(f"launch round {n + 1}/{launches}: " + ", ".join(
                f"{side} {figures[side][-1][0]:.2f} s ({figures[side][-1][1]:.2f} s CPU)" for side in SIDES))
    return figures


def fork_server_cpu(cluster: LocalCluster) -> float:
    """CPU the forking worker's fork server has used (its imports, once per worker, and its forks)."""
    worker = cluster.workers[SIDES["fork server"]]
    return sum(cpu_s(pid) for pid in children_of(worker.pid) if role_of(pid) == "forkserver")


def measure_test_files(files: list[str], runs: int) -> dict[str, dict[str, list[float]]]:
    walls: dict[str, dict[str, list[float]]] = {f: {side: [] for side in SIDES} for f in files}
    for n in range(runs):
        for path in files:
            order = list(SIDES) if n % 2 == 0 else list(reversed(SIDES))
            for side in order:
                env = dict(os.environ)
                env.pop(NO_FORK_SERVER_ENV, None)
                if side == "fresh interpreter":
                    env[NO_FORK_SERVER_ENV] = "1"
                start = time.monotonic()
                result = subprocess.run([sys.executable, "-m", "pytest", path, "-q", "-p", "no:cacheprovider"],
                                        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                wall = time.monotonic() - start
                if result.returncode:
                    raise SystemExit(f"{path} failed with {side}s:\n{result.stdout.decode()[-3000:]}")
                walls[path][side].append(wall)
                progress(f"{path} ({side}, run {n + 1}/{runs}): {wall:.0f} s")
    return walls


def load() -> str:
    return "load average " + ", ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--launches", type=int, default=20, help="launches on each side")
    parser.add_argument("--test-files", nargs="*",
                        default=["tests/integration/test_cluster.py", "tests/integration/test_recovery.py"],
                        help="integration test files to time whole, each way")
    parser.add_argument("--test-runs", type=int, default=1, help="runs of each file on each side")
    opts = parser.parse_args()
    if opts.launches < 1 or opts.test_runs < 0:
        parser.error("--launches must be at least 1 and --test-runs at least 0")
    before = load()
    with tempfile.TemporaryDirectory(prefix="gearbus-bench-launch-") as log_dir:
        cluster = start_cluster(log_dir)
        try:
            launches = asyncio.run(measure_launches(cluster.url, opts.launches, log_dir))
            server_cpu = fork_server_cpu(cluster)
        finally:
            cluster.stop()
    walls = measure_test_files(opts.test_files, opts.test_runs) if opts.test_runs else {}

    print(f"Executor launches ({opts.launches} each, interleaved; {before} at the start, {load()} at the end, "
          "on a machine shared with other work):\n")
    print("| launched by | LaunchExecutor to RegisterExecutor, median | CPU of the process by then, median |")
    print("|---|---|---|")
    medians = {side: (statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs))
               for side, runs in launches.items()}
    for side, (wall, cpu) in medians.items():
        print(f"| {side} | {wall:.2f} s | {cpu:.2f} s |")
    fork, fresh = medians["fork server"], medians["fresh interpreter"]
    print(f"| ratio (fresh / forked) | {fresh[0] / fork[0]:.1f}x | {fresh[1] / max(fork[1], 0.01):.1f}x |")
    print(f"\nThe fork server itself used {server_cpu:.2f} s of CPU (its imports, once per worker, and its forks).")
    if walls:
        print(f"\nIntegration test files, wall time ({opts.test_runs} run(s) each way, interleaved; median):\n")
        print("| file | fork server | fresh interpreters | ratio |")
        print("|---|---|---|---|")
        for path, sides in walls.items():
            fork_s, fresh_s = (statistics.median(sides[side]) for side in SIDES)
            print(f"| {path} | {fork_s:.0f} s | {fresh_s:.0f} s | {fresh_s / fork_s:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
