"""Nexmark benchmark: steady events/s of each query on the local runner, per core, gearbus
alone on generated events (bench/nexmark_flink.py sets it beside Flink on this machine).

    python bench/nexmark.py [--queries q0,q1,...] [--events 400000] [--rate R] [--parallelism 2]
                            [--repeat 1] [--timeout 900] [--check] [--keep]
    python bench/nexmark.py --state-run 600 [--rate 20000] [--query q8]

Each query runs as ``gearbus run --json examples/nexmark/qN.py --events N --all-events
--blackhole`` on the embedded cluster (checkpoints on, every second, as the cluster's
default; results written nowhere, as Flink's blackhole sink), once with N events and once
with 3N. ``--all-events``: one source makes every event and the query keeps the kinds it
uses, as the nexmark repository's harness does, so the events/s count the same work. The
steady rate is 2N / (running(3N) - running(N)), running being ACTIVE to SUCCEEDED as the
client saw it: start-up, the first checkpoint and the drain cancel out. Per core is that
divided by the machine's cores (every process of the run shares them). ``--rate`` is the
generator's events per second of event time (10,000 unless given; the nexmark repository's
V2 setup uses 100,000). ``--check`` also runs each query on N events into a file and compares
its rows with the DuckDB oracle (needs the dev dependencies: tests/support/nexmark.py).

``--state-run S`` instead runs one query (``--query``, default q8, a window join) on the
endless generator (``--rate`` events per second) for S seconds and samples its stateful
processors' live state (``gearbus_state_keys``/``gearbus_state_bytes``, from the app's
status) every 10 s: a join's state must stay flat, not grow with the stream.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(1, REPO)
from common import BenchError, in_temp_dir, parser_from_doc, run_app  # noqa: E402  (bench/, beside this file)

QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q11")
STATE_SAMPLE_S = 10
STATE_RUN_RATE = 20_000


def app(query: str) -> str:
    return os.path.join(REPO, "examples", "nexmark", f"{query}.py")


def steady_rate(query: str, events: int, parallelism: int, timeout: float, scratch: str,
                rate: int | None = None) -> tuple[float | None, dict]:
    """Events/s from the N and 3N runs (None when 3N did not take longer: too noisy)."""
    common = ["--parallelism", str(parallelism), "--all-events", "--blackhole"]
    common += ["--rate", str(rate)] if rate else []
    small = run_app(app(query), ["--events", str(events), *common], timeout, scratch)
    large = run_app(app(query), ["--events", str(3 * events), *common], timeout, scratch)
    extra = large["running_s"] - small["running_s"]
    return (2 * events / extra if extra > 0 else None), {"small": small, "large": large}


def check(query: str, events: int, parallelism: int, timeout: float, scratch: str) -> None:
    from tests.support.nexmark import assert_same_rows, oracle, read_output

    output, dumped = os.path.join(scratch, f"{query}.jsonl"), os.path.join(scratch, f"{query}-events.jsonl")
    run_app(app(query), ["--events", str(events), "--parallelism", str(parallelism), "--output", output,
                         "--dump-events", dumped], timeout, scratch)
    try:
        assert_same_rows(read_output(output), oracle(query, dumped))
    except AssertionError as exc:
        raise BenchError(f"{query}: the output differs from the oracle's rows: {exc}") from None


def benchmark(opts, scratch: str) -> int:
    cores = os.cpu_count() or 1
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    rows = []
    for query in opts.queries:
        if opts.check:
            check(query, min(opts.events, 50_000), opts.parallelism, opts.timeout, scratch)
            log(f"{query}: rows match the oracle")
        rates = []
        for _ in range(opts.repeat):
            rate, runs = steady_rate(query, opts.events, opts.parallelism, opts.timeout, scratch, opts.rate)
            log(f"{query}: running {runs['small']['running_s']:.2f} s for {opts.events:,} events, "
                f"{runs['large']['running_s']:.2f} s for {3 * opts.events:,}: "
                + (f"{rate:,.0f} events/s" if rate else "too noisy"))
            if rate:
                rates.append(rate)
        rows.append((query, statistics.median(rates) if rates else None))

    print(f"\nNexmark on the local runner: {opts.events:,} and {3 * opts.events:,} events at "
          f"{opts.rate or 10_000:,} events/s of event time, parallelism {opts.parallelism}, {cores} cores, "
          f"checkpoints every second, blackhole sink; median of {opts.repeat}")
    print(f"{'query':<7}{'events/s':>12}{'per core':>12}")
    for query, rate in rows:
        print(f"{query:<7}{_n(rate):>12}{_n(rate / cores if rate else None):>12}")
    print("events/s: every event of every kind, which one source made and the query split by kind. Beside Flink "
          "on this machine: bench/nexmark_flink.py.")
    return 0


def state_run(opts, scratch: str) -> int:
    """Run ``opts.query`` on the endless generator for ``opts.state_run`` seconds; print its
    stateful processors' state every STATE_SAMPLE_S seconds."""
    from gearbus.runners import LocalRunner

    async def run() -> list[tuple[float, int, int]]:
        runner = LocalRunner(workers=2, log_dir=os.path.join(scratch, "logs"))
        samples = []
        try:
            await runner.start(app(opts.query), ["--rate", str(opts.rate or STATE_RUN_RATE), "--blackhole",
                                                 "--parallelism", str(opts.parallelism)])
            started = time.monotonic()
            while time.monotonic() - started < opts.state_run:
                await asyncio.sleep(STATE_SAMPLE_S)
                elapsed = time.monotonic() - started
                status = await runner.status()
                if status.error is not None:
                    raise BenchError(f"{opts.query} failed: {status.error.error_type}: {status.error.message}")
                keys = sum(p.state_keys for p in status.processors)
                size = sum(p.state_bytes for p in status.processors)
                handled = sum(p.records_in for p in status.processors)
                samples.append((elapsed, keys, size))
                print(f"{elapsed:7.0f} s  state {keys:>10,} keys {size / 1e6:>9.2f} MB  "
                      f"(records taken in by all processors so far: {handled:,})", flush=True)
        finally:
            await runner.stop()
        return samples

    samples = asyncio.run(run())
    if len(samples) >= 4:
        half = len(samples) // 2
        first, last = samples[1:half], samples[half:]
        grew = statistics.mean(s[1] for s in last) / max(statistics.mean(s[1] for s in first), 1)
        print(f"\n{opts.query} at {opts.rate or STATE_RUN_RATE:,} events/s for {opts.state_run:.0f} s: state keys, "
              f"second half / first half (after the first sample) = {grew:.2f}; max {max(s[1] for s in samples):,} keys, "
              f"{max(s[2] for s in samples) / 1e6:.2f} MB")
    return 0


def _n(value: float | None) -> str:
    return f"{value:,.0f}" if value else "-"


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--queries", default=",".join(QUERIES), help="comma-separated queries")
    parser.add_argument("--events", type=int, default=400_000, help="N: the small run's events (the large one: 3N)")
    parser.add_argument("--parallelism", type=int, default=2, help="tasks per source and stage")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per query (the median is shown)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per gearbus run")
    parser.add_argument("--check", action="store_true", help="also check each query's rows against the oracle")
    parser.add_argument("--state-run", type=float, metavar="S", help="run --query on the endless generator for S s "
                                                                     "and sample its state instead")
    parser.add_argument("--query", default="q8", help="--state-run: the query")
    parser.add_argument("--rate", type=int, help="events per second of event time (default: the generator's "
                                                  f"10000; {STATE_RUN_RATE} with --state-run)")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (printed)")
    opts = parser.parse_args(argv)
    opts.queries = [q.strip() for q in opts.queries.split(",") if q.strip()]
    unknown = [q for q in opts.queries + [opts.query] if q not in QUERIES]
    if unknown:
        parser.error(f"unknown queries {', '.join(unknown)}; choose from {', '.join(QUERIES)}")
    if min(opts.events, opts.parallelism, opts.repeat, opts.rate or 1) < 1:
        parser.error("--events, --parallelism, --repeat and --rate must be at least 1")
    return in_temp_dir("gearbus-nexmark-", opts.keep,
                       lambda scratch: state_run(opts, scratch) if opts.state_run else benchmark(opts, scratch))


if __name__ == "__main__":
    sys.exit(main())
