"""What measuring costs, and how fast the dashboard answers.

    python bench/metrics.py [--lines 200000] [--repeat 5] [--apps 20] [--requests 500]

1. Throughput with task metrics on and off, in one run: one embedded cluster (nats-server,
   master, 2 workers) runs the shuffle-heavy wordcount (``--combine-keys 1``: about 2-3
   records per line cross the hash shuffle) on the same seeded file, alternating the app
   config ``task_metrics`` true / false, ``--repeat`` times each; the figure is lines per
   second of the running phase (ACTIVE to SUCCEEDED, as the client sees the state events),
   median per setting, and the ratio on / off (goal >= 0.97). Byte, credit-wait and inbox
   counters are always kept; ``task_metrics`` switches the per-batch timing (two clock
   reads and a histogram bucket per batch). Every output is checked against a Counter.
2. The dashboard with ``--apps`` apps running (each the ticker example at 20 numbers/s):
   ``--requests`` sequential GET /api/v1/apps/ID (IDs in turn), p50 / p99 / max latency
   (goal p99 <= 50 ms), and one /metrics scrape's time and size.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from common import count_problems, parser_from_doc  # noqa: E402  (bench/, beside this file)

from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from shared.messages import AppState  # noqa: E402

WORDCOUNT = os.path.join(REPO, "examples", "wordcount.py")
TICKER = os.path.join(REPO, "examples", "ticker.py")


def generate(path: str, lines: int) -> collections.Counter:
    counts = collections.Counter()
    with open(path, "w", encoding="utf-8") as f:
        for n in range(lines):
            words = [f"w{(n * 31 + k * 7919) % 10_000}" for k in range(10)]
            counts.update(words)
            f.write(" ".join(words) + "\n")
    return counts


def read_counts(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        return {row["word"]: row["count"] for row in map(json.loads, f)}


async def run_once(client: Client, text: str, output: str, metrics: bool) -> float:
    app_id = await client.submit(pack(WORDCOUNT), ["--input", text, "--output", output, "--combine-keys", "1"],
                                 config={"task_metrics": metrics})
    seen: dict[str, float] = {}
    final = await client.wait(app_id, timeout=600, seen=seen)
    if final.state != AppState.SUCCEEDED:
        raise SystemExit(f"wordcount ended {final.state}: {final.error}")
    return seen[AppState.SUCCEEDED] - seen[AppState.ACTIVE]


async def throughput(client: Client, tmp: str, lines: int, repeat: int) -> None:
    text = os.path.join(tmp, "text.txt")
    expected = generate(text, lines)
    rates: dict[bool, list[float]] = {True: [], False: []}
    for n in range(repeat):
        for metrics in ((True, False) if n % 2 == 0 else (False, True)):
            output = os.path.join(tmp, f"out-{n}-{metrics}.jsonl")
            seconds = await run_once(client, text, output, metrics)
            problems = count_problems(read_counts(output), expected, "words")
            if problems:
                raise SystemExit("wrong output: " + "; ".join(problems))
            rates[metrics].append(lines / seconds)
            print(f"  run {n + 1} task_metrics={str(metrics).lower():5}  {lines / seconds:>10,.0f} lines/s")
    on, off = statistics.median(rates[True]), statistics.median(rates[False])
    print(f"\nwordcount --combine-keys 1, {lines:,} lines, median of {repeat}:")
    print(f"  task_metrics off  {off:>10,.0f} lines/s")
    print(f"  task_metrics on   {on:>10,.0f} lines/s")
    print(f"  ratio on / off    {on / off:10.3f}  (goal >= 0.97)")


def get(url: str) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as response:
        size = len(response.read())
    return time.perf_counter() - started, size


async def dashboard(cluster: LocalCluster, client: Client, tmp: str, apps: int, requests: int) -> None:
    from gearbus.dashboard.server import serve

    ids = [await client.submit(pack(TICKER), ["--output", os.path.join(tmp, f"ticks-{n}.jsonl"), "--rate", "20"],
                               config={"executors": 1}) for n in range(apps)]
    async with asyncio.timeout(120):
        while sum(a.state == AppState.ACTIVE and bool(a.processors) for a in await client.list()) < apps:
            await asyncio.sleep(0.5)
    port = 18_000 + os.getpid() % 1000
    serving = asyncio.create_task(serve([cluster.url], "127.0.0.1", port))
    base = f"http://127.0.0.1:{port}"
    async with asyncio.timeout(20):
        while True:
            try:
                await asyncio.to_thread(get, base + "/api/v1/cluster")
                break
            except OSError:
                await asyncio.sleep(0.1)
    latencies = []
    for n in range(requests):
        took, _ = await asyncio.to_thread(get, f"{base}/api/v1/apps/{ids[n % apps]}")
        latencies.append(took * 1000)
    latencies.sort()
    scrape, size = await asyncio.to_thread(get, base + "/metrics")
    print(f"\ndashboard, {apps} apps running, {requests} sequential GET /api/v1/apps/ID:")
    print(f"  p50 {statistics.median(latencies):.1f} ms, p99 {latencies[int(len(latencies) * 0.99) - 1]:.1f} ms, "
          f"max {latencies[-1]:.1f} ms  (goal p99 <= 50 ms)")
    print(f"  /metrics: {scrape * 1000:.0f} ms, {size:,} bytes")
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)
    for app_id in ids:
        await client.kill(app_id)


async def main() -> None:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--apps", type=int, default=20)
    parser.add_argument("--requests", type=int, default=500)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gearbus-bench-metrics-") as tmp, \
            LocalCluster(workers=2, slots=max(8, opts.apps), log_dir=os.path.join(tmp, "logs")) as cluster:
        async with Client(cluster.url, timeout=60) as client:
            async with asyncio.timeout(60):
                while len((await client.info()).workers) < 2:
                    await asyncio.sleep(0.2)
            await throughput(client, tmp, opts.lines, opts.repeat)
            await dashboard(cluster, client, tmp, opts.apps, opts.requests)


if __name__ == "__main__":
    asyncio.run(main())
