"""Intermediate streams against the bus: the same keyed pipeline (bench/stages_app.py) in
one stage, with a hash shuffle over the bus, and in two stages over an intermediate
stream, in one run, on the embedded cluster.

    python bench/stages.py [--count 1000000] [--rate 5000] [--latency-seconds 15] [--pause-seconds 10]

1. Throughput: the generator unthrottled, ``--count`` events; events per second at the
   sink while the middle 80% of them arrive (steady state: without the start, and the
   last checkpoint's wait at the end), and end to end (the first event's generation to
   the sink's last write); the ratios two stages / one stage (goal >= 0.7).
2. Latency: ``--rate`` events per second for ``--latency-seconds``: p50, p99 and p99.9
   from generation to the sink, each way (two stages add about a checkpoint interval: the
   stream is written when the upstream stage's checkpoint completes; 1 s here).
3. Pause: two stages at ``--rate``, the downstream stage standing still for
   ``--pause-seconds`` mid-run (its counting waits while a file exists; its processes
   stay alive, as behind a slow call): the upstream stage's events per second meanwhile
   against the same span before (goal: unchanged), the stream's backlog when the pause
   ends, and how long the downstream stage then takes to catch up.
"""

from __future__ import annotations

import asyncio
import glob
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bench.common import BenchError, embedded_cluster, in_temp_dir, parser_from_doc, run_app  # noqa: E402

APP = os.path.join(REPO, "bench", "stages_app.py")
GOAL_RATIO = 0.7


def percentile(values: list[float], q: float) -> float:
    return values[min(int(len(values) * q), len(values) - 1)]


def sink_figures(output: str, expected: int) -> dict:
    """Events per second end to end (the first event's generation to the sink's last write)
    and latencies."""
    spans = [json.load(open(path)) for path in glob.glob(os.path.join(output, "sink-*.json"))]
    records = sum(s["records"] for s in spans)
    if records != expected:
        raise BenchError(f"the sink saw {records} events, expected {expected}")
    first, last = min(s["born"] for s in spans if s["records"]), max(s["last"] for s in spans)
    latencies = sorted(float(line) for path in glob.glob(os.path.join(output, "sink-*.txt")) for line in open(path))
    writes = sorted(tuple(map(float, line.split())) for path in glob.glob(os.path.join(output, "sink-*.batches"))
                    for line in open(path))
    arrived, at = 0, []
    for when, n in writes:
        arrived += n
        at.append((arrived, when))
    t10 = next(when for n, when in at if n >= 0.1 * records)
    t90 = next(when for n, when in at if n >= 0.9 * records)
    return {"rate": records / max(last - first, 1e-9), "steady": 0.8 * records / max(t90 - t10, 1e-9),
            "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99), "p99.9": percentile(latencies, 0.999)}


def run(via: str, rate: float, count: int, tmp: str, name: str) -> dict:
    output = os.path.join(tmp, name)
    run_app(APP, ["--via", via, "--rate", str(rate), "--count", str(count), "--output", output], 600,
            os.path.join(tmp, f"{name}-scratch"))
    return sink_figures(output, count)


async def paused(rate: float, pause_s: float, tmp: str) -> dict:
    """The downstream stage standing still for ``pause_s`` in the middle of a run at ``rate``."""
    from gearbus.artifact import pack
    from gearbus.client import Client
    from shared.messages import AppState

    count = int(rate * (3 * pause_s + 10))
    pause_file = os.path.join(tmp, "pause")
    with embedded_cluster(os.path.join(tmp, "pause-cluster")) as (_, cluster):
        async with Client(cluster.url, timeout=30) as client:
            app_id = await client.submit(pack(APP), ["--via", "jetstream", "--rate", str(rate), "--count", str(count),
                                                     "--output", os.path.join(tmp, "paused"),
                                                     "--pause-file", pause_file])
            while len((await client.status(app_id)).stage_apps) < 2:
                await asyncio.sleep(0.2)
            upstream, downstream = (await client.status(app_id)).stage_apps

            async def emitted() -> tuple[float, int]:
                status = await client.status(upstream)
                return time.monotonic(), sum(c.records_in for c in status.tasks)  # read by the sources

            async def backlog() -> int:
                return (await client.status(app_id)).streams[0].messages

            while (await client.status(downstream)).state != AppState.ACTIVE or (await emitted())[1] < rate * 3:
                if (await client.status(app_id)).state in AppState.TERMINAL:
                    raise BenchError("the paused run ended before the pause")
                await asyncio.sleep(0.2)
            before = await emitted()
            await asyncio.sleep(pause_s)
            start = await emitted()
            open(pause_file, "w").close()
            try:
                await asyncio.sleep(pause_s)
                end = await emitted()
                held = await backlog()
            finally:
                os.remove(pause_file)
            resumed = time.monotonic()
            while await backlog() > held // 10:
                await asyncio.sleep(0.1)
            caught_up = time.monotonic() - resumed
            final = await client.wait(app_id, timeout=600)
            if final.state != AppState.SUCCEEDED:
                raise BenchError(f"the paused run ended {final.state}: {final.error}")
            restarts = (await client.status(downstream)).restarts
    return {"before": (start[1] - before[1]) / (start[0] - before[0]),
            "during": (end[1] - start[1]) / (end[0] - start[0]), "backlog": held, "caught_up": caught_up,
            "restarts": restarts}


def say(line: str) -> None:
    print(line, flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--count", type=int, default=1_000_000, help="events of the throughput runs")
    parser.add_argument("--rate", type=float, default=5_000, help="events per second of the latency and pause runs")
    parser.add_argument("--latency-seconds", type=float, default=15)
    parser.add_argument("--pause-seconds", type=float, default=10)
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory")
    opts = parser.parse_args(argv)

    def work(tmp: str) -> int:
        say(f"throughput, {opts.count} events, generator unthrottled:")
        one = run("bus", 10**9, opts.count, tmp, "one-stage")
        two = run("jetstream", 10**9, opts.count, tmp, "two-stages")
        say(f"  {'':29s} {'steady':>10s} {'end to end':>12s}  (events/s)")
        say(f"  one stage (bus shuffle)       {one['steady']:10,.0f} {one['rate']:12,.0f}")
        say(f"  two stages (stream)           {two['steady']:10,.0f} {two['rate']:12,.0f}")
        say(f"  ratio two/one                 {two['steady'] / one['steady']:10.2f} {two['rate'] / one['rate']:12.2f}"
            f"  (goal >= {GOAL_RATIO})")
        count = int(opts.rate * opts.latency_seconds)
        say(f"latency at {opts.rate:,.0f} events/s for {opts.latency_seconds:g} s (ms, generation to sink):")
        for label, via in (("one stage (bus shuffle)", "bus"), ("two stages (stream)", "jetstream")):
            f = run(via, opts.rate, count, tmp, f"latency-{via}")
            say(f"  {label:29s} p50 {f['p50']:8.1f}  p99 {f['p99']:8.1f}  p99.9 {f['p99.9']:8.1f}")
        say(f"downstream stage standing still for {opts.pause_seconds:g} s at {opts.rate:,.0f} events/s:")
        p = asyncio.run(paused(opts.rate, opts.pause_seconds, tmp))
        say(f"  upstream before the pause     {p['before']:10,.0f} events/s")
        say(f"  upstream during the pause     {p['during']:10,.0f} events/s   (ratio {p['during'] / p['before']:.2f})")
        say(f"  stream backlog at its end     {p['backlog']:10,} messages; 90% of it read {p['caught_up']:.1f} s later; "
            f"downstream restarts {p['restarts']}; the app succeeded")
        return 0

    return in_temp_dir("gearbus-bench-stages-", opts.keep, work)


if __name__ == "__main__":
    sys.exit(main())
