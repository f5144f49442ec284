"""Event-to-sink latency: a generator at a steady rate through a two-stage pipeline on the
embedded cluster (two hops over NATS), beside a baseline of two bare nats-py hops.

    python bench/latency.py [--rate 10000] [--seconds 10] [--warmup-seconds 1]

gearbus: `gearbus run bench/latency_app.py` (generator -> forward task -> sink, each on
its own executor); every event carries its generation time and the sink records the
delay. Baseline, in the same run: one process publishes msgpack events at the same rate,
a second connection relays them to a third subject, a third receives them — the floor
of two NATS hops from Python. Prints p50/p99/p99.9 and the ratios; the target is
p99 <= 5 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import glob
import os
import subprocess
import sys
import tempfile
import time

import msgpack
import nats

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from gearbus.natsserver import NatsServer  # noqa: E402

TARGET_P99_MS = 5.0


def percentiles(latencies: list[float]) -> dict[str, float]:
    values = sorted(latencies)
    n = len(values)
    return {name: values[min(int(n * q), n - 1)] for name, q in (("p50", 0.5), ("p99", 0.99), ("p99.9", 0.999))} | {
        "max": values[-1]}


def run_gearbus(rate: float, count: int, warmup: int, workdir: str, secure: bool = False) -> dict[str, float]:
    """``secure``: on `gearbus run --secure` (a credential per role, TLS)."""
    output = os.path.join(workdir, "latency" + ("-secure" if secure else ""))
    gearbus = os.path.join(os.path.dirname(sys.executable), "gearbus")
    command = [gearbus] if os.access(gearbus, os.X_OK) else [sys.executable, "-m", "gearbus.cli"]
    done = subprocess.run(command + ["run", *(["--secure"] if secure else []),
                                     os.path.join(REPO, "bench", "latency_app.py"), "--rate", str(rate),
                                     "--count", str(count), "--output", output],
                          capture_output=True, text=True, cwd=REPO)
    if done.returncode != 0:
        raise SystemExit(f"gearbus run failed:\n{done.stderr}")
    latencies = []
    for path in glob.glob(os.path.join(output, "latency-*.txt")):
        with open(path) as f:
            latencies += [float(line) for line in f][warmup:]
    if len(latencies) < count - warmup:
        raise SystemExit(f"the sink saw {len(latencies)} events after warm-up, expected {count - warmup}")
    return percentiles(latencies)


async def run_baseline(rate: float, count: int, warmup: int) -> dict[str, float]:
    """Two bare hops: publisher -> relay -> receiver, msgpack payloads, one process."""
    with NatsServer(jetstream=False) as server:
        publisher, relay, receiver = [await nats.connect(server.url) for _ in range(3)]
        latencies: list[float] = []
        finished = asyncio.Event()

        async def forward(msg):
            await relay.publish("bench.hop2", msg.data)

        async def measure(msg):
            latencies.append((time.time() - msgpack.unpackb(msg.data)["t"]) * 1000)
            if len(latencies) == count:
                finished.set()

        await relay.subscribe("bench.hop1", cb=forward)
        await receiver.subscribe("bench.hop2", cb=measure)
        await relay.flush()
        await receiver.flush()
        started, period = time.monotonic(), 1 / rate
        for n in range(count):
            delay = started + n * period - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            await publisher.publish("bench.hop1", msgpack.packb({"n": n, "t": time.time()}))
        await asyncio.wait_for(finished.wait(), 30)
        for connection in (publisher, relay, receiver):
            await connection.close()
    return percentiles(latencies[warmup:])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=10_000, help="events per second (default 10000)")
    parser.add_argument("--seconds", type=float, default=10, help="how long to send (default 10)")
    parser.add_argument("--warmup-seconds", type=float, default=1, help="events left out at the start (default 1)")
    opts = parser.parse_args(argv)
    count, warmup = int(opts.rate * opts.seconds), int(opts.rate * opts.warmup_seconds)
    with tempfile.TemporaryDirectory(prefix="gearbus-latency-") as workdir:
        ours = run_gearbus(opts.rate, count, warmup, workdir)
    base = asyncio.run(run_baseline(opts.rate, count, warmup))
    print(f"latency: {opts.rate:,.0f} events/s for {opts.seconds:g} s, first {opts.warmup_seconds:g} s left out; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}")
    print(f"{'ms':<8}{'gearbus (2 hops)':>18}{'bare NATS (2 hops)':>20}{'ratio':>8}")
    for name in ("p50", "p99", "p99.9", "max"):
        print(f"{name:<8}{ours[name]:>18.3f}{base[name]:>20.3f}{ours[name] / base[name]:>8.2f}")
    verdict = "meets" if ours["p99"] <= TARGET_P99_MS else "MISSES"
    print(f"target p99 <= {TARGET_P99_MS:g} ms: {verdict} ({ours['p99']:.3f} ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
