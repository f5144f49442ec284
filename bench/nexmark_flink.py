"""Nexmark on gearbus beside Apache Flink, on this machine, over the same events file, in one
run: events/s per core of each engine, their ratio, and each engine's start-up.

    python bench/nexmark_flink.py [--queries q0,q1,...] [--events 300000] [--rate 10000,100000]
                                  [--state hashmap|rocksdb] [--parallelism 2] [--repeat 1]
                                  [--check] [--profile] [--engines gearbus,flink]
                                  [--flink-venv DIR] [--timeout 900] [--keep]

For each rate (``--rate``: events per second of event time; 10,000 is the generator's default,
100,000 the nexmark repository's V2 setup, where windows and joins hold ten times the events)
the bench writes the first N and 3N generated events to JSON Lines files, then runs each query
on each engine over both files, engines interleaved (their order swapped every repeat):

- gearbus: ``gearbus run --json examples/nexmark/qN.py --input FILE --all-events --blackhole
  --parallelism P`` on the embedded cluster (checkpoints every second, exactly-once);
- Flink: bench/flink_job.py in a virtual environment of its own (PyFlink, the
  ``apache-flink`` package, whose pins conflict with pyspark's), created on first use in
  ``--flink-venv``: the nexmark repository's SQL over the filesystem connector's JSON format
  with its 4 s watermark, a local mini-cluster of parallelism P, checkpoints every second,
  exactly-once, ``--state`` (heap ``hashmap`` or ``rocksdb``), blackhole sinks.

The steady rate is 2N / (R(3N) - R(N)), R being the time the job ran (gearbus: ACTIVE to
SUCCEEDED as the client saw it; Flink: from submitting the INSERT to the job's end), so what
is the same in both runs (deploying tasks, the first checkpoint, the drain) cancels out.
Start-up is shown on its own: the whole command, from start to exit, on the first 1,000
events (the JVM or the embedded cluster, planning, deploying, the first and last
checkpoints, shutting down). Per core is the rate over the machine's cores (every
process of a run shares them). The table gives the median and the spread (min-max) over
``--repeat``. ``--check`` first runs each query on the N file on both engines with its rows
written instead of discarded (the same configuration otherwise) and holds them against the
DuckDB oracle (tests/support/nexmark.py; the dev dependencies).

``--profile`` also profiles gearbus's steady state with py-spy (``pip install py-spy``):
every process of the N and 3N runs, the difference between the two split by what the CPU
was doing (bench/cpu_split.py) and printed as microseconds of CPU per event.

Without Java 11+ or when the Flink environment cannot be made, the bench says what to install
and runs gearbus alone; a query Flink fails on says so in its row.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(BENCH)
sys.path.insert(0, BENCH)
sys.path.insert(1, REPO)
import cpu_split  # noqa: E402  (bench/, beside this file)
from common import BenchError, in_temp_dir, parser_from_doc, run_app  # noqa: E402

QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8", "q9", "q11")
ENGINES = ("gearbus", "flink")
FLINK_VERSION = "2.3.0"
FLINK_JOB = os.path.join(BENCH, "flink_job.py")
PROFILE_RATE_HZ = 100
STARTUP_EVENTS = 1000  # start-up: the whole command on this many events


def default_venv() -> str:
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "gearbus", f"pyflink-{FLINK_VERSION}")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- Flink's environment -------------------------------------------------------------------

def java_problem() -> str | None:
    """Why Flink cannot run here (no Java 11+), or None."""
    java = os.path.join(os.environ["JAVA_HOME"], "bin", "java") if os.environ.get("JAVA_HOME") else shutil.which("java")
    if not java or not os.path.exists(java):
        return "no Java found: Flink needs Java 11 or newer (e.g. apt-get install openjdk-17-jre-headless)"
    probe = subprocess.run([java, "-version"], capture_output=True, text=True)
    words = (probe.stderr or probe.stdout).split('"')
    version = words[1] if len(words) > 1 else "?"
    major = version.split(".")[0] if not version.startswith("1.") else version.split(".")[1]
    if not major.isdigit() or int(major) < 11:
        return f"Java {version} at {java} is too old: Flink needs Java 11 or newer (Java 17 recommended)"
    return None


def flink_python(venv: str) -> tuple[str | None, str | None]:
    """The Python of the PyFlink environment, made on first use; or None and why not."""
    problem = java_problem()
    if problem:
        return None, problem
    python = os.path.join(venv, "bin", "python")
    if not os.path.exists(python):
        log(f"Making a virtual environment for PyFlink {FLINK_VERSION} in {venv} (once; about 850 MB; "
            f"--flink-venv chooses another place) ...")
        made = subprocess.run([sys.executable, "-m", "venv", venv], capture_output=True, text=True)
        if made.returncode != 0:
            return None, f"could not make a virtual environment in {venv}: {made.stderr.strip()}"
    check = subprocess.run([python, "-c", "import pyflink.version as v; print(v.__version__)"],
                           capture_output=True, text=True)
    if check.returncode != 0 or check.stdout.strip() != FLINK_VERSION:
        log(f"Installing apache-flink=={FLINK_VERSION} into {venv} ...")
        pip = subprocess.run([python, "-m", "pip", "install", "-q", f"apache-flink=={FLINK_VERSION}"],
                             capture_output=True, text=True)
        if pip.returncode != 0:
            return None, (f"'{python} -m pip install apache-flink=={FLINK_VERSION}' failed: "
                          f"{pip.stderr.strip()[-500:]}")
    log(f"Flink: PyFlink {FLINK_VERSION} from {venv}")
    return python, None


# --- one run of each engine ----------------------------------------------------------------

def run_gearbus(query: str, events_file: str, opts, scratch: str, output: str | None = None) -> dict:
    args = ["--input", events_file, "--all-events", "--parallelism", str(opts.parallelism)]
    args += ["--output", output] if output else ["--blackhole"]
    summary = run_app(os.path.join(REPO, "examples", "nexmark", f"{query}.py"), args, opts.timeout, scratch)
    return {"wall_s": summary["wall_s"], "running_s": summary["running_s"]}


def run_flink(python: str, query: str, events_file: str, opts, scratch: str, rows: str | None = None) -> dict:
    """bench/flink_job.py once; its wall time, or raises BenchError with the job's last words."""
    checkpoints = os.path.join(scratch, "flink-checkpoints")
    cmd = [python, FLINK_JOB, query, events_file, "--checkpoint-dir", checkpoints,
           "--parallelism", str(opts.parallelism), "--state", opts.state] + (["--rows", rows] if rows else [])
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=scratch, capture_output=True, text=True, timeout=opts.timeout,
                              env=dict(os.environ, TMPDIR=scratch))
    except subprocess.TimeoutExpired:
        raise BenchError(f"Flink did not finish {query} within {opts.timeout:g} s") from None
    finally:
        shutil.rmtree(checkpoints, ignore_errors=True)
    wall = time.perf_counter() - started
    if proc.returncode != 0:
        reason = next((line for line in reversed(proc.stderr.splitlines()) if "Exception" in line or "Error" in line),
                      proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}")
        raise BenchError(f"Flink failed on {query}: {reason.strip()[:300]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"wall_s": wall, "running_s": summary["running_s"]}


# --- the measurements ----------------------------------------------------------------------

def write_inputs(rate: int, events: int, scratch: str) -> tuple[str, str, str]:
    """The STARTUP_EVENTS, N and 3N events files at ``rate`` events/s of event time (the
    smaller ones are the first lines of the largest)."""
    from gearbus.nexmark import GeneratorConfig, write_events

    os.makedirs(scratch, exist_ok=True)
    large = os.path.join(scratch, f"events-{rate}-{3 * events}.jsonl")
    small = os.path.join(scratch, f"events-{rate}-{events}.jsonl")
    tiny = os.path.join(scratch, f"events-{rate}-{STARTUP_EVENTS}.jsonl")
    started = time.perf_counter()
    write_events(large, 3 * events, GeneratorConfig(rate=rate))
    for path, count in ((small, events), (tiny, STARTUP_EVENTS)):
        with open(large, encoding="utf-8") as source, open(path, "w", encoding="utf-8") as target:
            for _, line in zip(range(count), source):
                target.write(line)
    log(f"events at {rate:,}/s of event time: {3 * events:,} written in {time.perf_counter() - started:.1f} s "
        f"({os.path.getsize(large) / 1e6:.0f} MB), spanning {3 * events / rate:,.0f} s of event time")
    return tiny, small, large


def check(query: str, engine: str, small: str, opts, flink: str | None, scratch: str) -> str:
    """``ok`` when the engine's rows over the N file equal the oracle's, else what differs."""
    from tests.support.nexmark import assert_same_rows, oracle, read_output

    output = os.path.join(scratch, f"{engine}-{query}.jsonl")
    try:
        if engine == "gearbus":
            run_gearbus(query, small, opts, scratch, output=output)
        else:
            run_flink(flink, query, small, opts, scratch, rows=output)
    except BenchError as exc:
        return f"failed: {exc}"
    rows, expected = read_output(output), oracle(query, small)
    if engine == "flink" and query == "q7":  # its SQL inserts price and bidder by position, swapped
        rows = [dict(row, bidder=row["price"], price=row["bidder"]) for row in rows]
    if engine == "flink" and query == "q4":  # Flink's AVG of a BIGINT truncates to a BIGINT
        expected = [dict(row, final=int(row["final"])) for row in expected]
    try:
        assert_same_rows(rows, expected)
    except AssertionError as exc:
        return f"DIFFERS: {str(exc)[:200]}"
    return "ok"


def measure(query: str, files: tuple[str, str, str], opts, flink: str | None, scratch: str) -> dict:
    """Per engine: the steady rates, start-ups and failure (if any) over ``opts.repeat`` rounds."""
    results = {engine: {"rates": [], "startups": [], "error": None} for engine in opts.engines}
    for round_no in range(opts.repeat):
        order = opts.engines if round_no % 2 == 0 else opts.engines[::-1]
        runs = {engine: {} for engine in opts.engines}
        for size, path in zip(("tiny", "small", "large"), files):
            for engine in order:
                if results[engine]["error"]:
                    continue
                try:
                    runs[engine][size] = (run_gearbus(query, path, opts, scratch) if engine == "gearbus"
                                          else run_flink(flink, query, path, opts, scratch))
                except BenchError as exc:
                    results[engine]["error"] = str(exc).splitlines()[0]
                    log(f"{query} {engine}: {exc}")
        for engine in opts.engines:
            if results[engine]["error"]:
                continue
            on_n, on_3n = runs[engine]["small"], runs[engine]["large"]
            results[engine]["startups"].append(runs[engine]["tiny"]["wall_s"])
            extra = on_3n["running_s"] - on_n["running_s"]
            if extra <= 0:
                log(f"{query} {engine}: 3N ran no longer than N ({runs[engine]}); round not counted")
                continue
            rate = 2 * opts.events / extra
            results[engine]["rates"].append(rate)
            log(f"{query} {engine}: {runs[engine]['tiny']['wall_s']:.2f} s for {STARTUP_EVENTS:,} events; running "
                f"{on_n['running_s']:.2f} s for {opts.events:,} (command {on_n['wall_s']:.2f} s), "
                f"{on_3n['running_s']:.2f} s for {3 * opts.events:,} (command {on_3n['wall_s']:.2f} s): "
                f"{rate:,.0f} events/s")
    return results


def profile(query: str, files: tuple[str, str, str], opts, scratch: str) -> dict[str, float]:
    """gearbus's steady state by cost: per category, the py-spy samples of the 3N run less
    those of the N run, as seconds over the 2N events between them (microseconds per event);
    the costs of a run (the control plane, start-up) are the N run's, in seconds."""
    counts = {}
    for size, path in zip(("small", "large"), files[1:]):
        raw = os.path.join(scratch, f"profile-{query}-{size}.txt")
        args = ["--input", path, "--all-events", "--blackhole", "--parallelism", str(opts.parallelism)]
        app = os.path.join(REPO, "examples", "nexmark", f"{query}.py")
        cmd = cpu_split.record_command(raw, PROFILE_RATE_HZ) + [sys.executable, "-m", "gearbus.cli", "run", "--json",
                                                                app, *args]
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=opts.timeout,
                              env=dict(os.environ, TMPDIR=scratch))
        if proc.returncode != 0 or not os.path.exists(raw):
            raise BenchError(f"py-spy could not profile {query}: {proc.stderr.strip()[-500:]}")
        counts[size] = cpu_split.split(raw)
    per_event = {name: (counts["large"][name] - counts["small"][name]) / PROFILE_RATE_HZ / (2 * opts.events) * 1e6
                 for name in cpu_split.CATEGORIES}
    return {**per_event, **{name: counts["small"][name] / PROFILE_RATE_HZ for name in cpu_split.PER_RUN}}


# --- printing ------------------------------------------------------------------------------

def _k(value: float | None) -> str:
    return f"{value / 1000:,.0f}K" if value else "-"


def _spread(values: list[float], per: float) -> str:
    if len(values) < 2:
        return ""
    return f" ({_k(min(values) / per)}-{_k(max(values) / per)})"


def print_table(rate: int, rows: dict, checks: dict, opts, cores: int) -> None:
    print(f"\nNexmark at {rate:,} events/s of event time: files of {opts.events:,} and {3 * opts.events:,} events, "
          f"parallelism {opts.parallelism}, checkpoints every 1 s exactly-once, blackhole sinks, Flink "
          f"{FLINK_VERSION} with {opts.state} state, {cores} cores; medians of {opts.repeat} (min-max)")
    header = f"{'query':<6}"
    for engine in opts.engines:
        header += f"{engine + ' ev/s/core':>26}{'start-up':>10}"
    if len(opts.engines) == 2:
        header += f"{'gearbus/Flink':>15}"
    if checks:
        header += "  rows vs oracle"
    print(header)
    for query, results in rows.items():
        line, per_core = f"{query:<6}", {}
        for engine in opts.engines:
            result = results[engine]
            if result["error"]:
                line += f"{'failed (below)':>26}{'':>10}"
                continue
            if result["rates"]:
                per_core[engine] = statistics.median(result["rates"]) / cores
                cell = _k(per_core[engine]) + _spread(result["rates"], cores)
            else:
                cell = "too noisy"
            line += f"{cell:>26}{statistics.median(result['startups']):>9.1f}s"
        if len(opts.engines) == 2:
            ratio = (f"{per_core['gearbus'] / per_core['flink']:.2f}" if len(per_core) == 2 else "-")
            line += f"{ratio:>15}"
        if checks:
            line += "  " + ", ".join(f"{engine} {checks[query][engine]}" for engine in opts.engines)
        print(line)
        for engine in opts.engines:
            if results[engine]["error"]:
                print(f"{'':<6}{engine}: {results[engine]['error']}")


def print_profile(rate: int, split: dict[str, dict[str, float]]) -> None:
    names = cpu_split.CATEGORIES
    width = {name: max(len(name) + 2, 8) for name in names}
    print(f"\nWhere gearbus's time goes at {rate:,} events/s of event time, steady state: the share of each cost "
          f"(py-spy, the GIL holder of every process, 3N run less N run); total = microseconds per event under the "
          f"profiler; then the N run's own costs, in seconds: the control plane (master, workers, AppMaster, "
          f"client) and start-up (importing, in every process)")
    print(f"{'query':<6}{'total':>8}" + "".join(f"{name:>{width[name]}}" for name in names)
          + "".join(f"{name:>{len(name) + 2}}" for name in cpu_split.PER_RUN))
    shares = collections.defaultdict(list)
    for query, row in split.items():
        total = sum(row[name] for name in names)
        line = f"{query:<6}{total:>8.1f}"
        for name in names:
            share = row[name] / total if total > 0 else 0.0
            shares[name].append(share)
            line += f"{share:>{width[name]}.0%}"
        print(line + "".join(f"{row[name]:>{len(name) + 1}.1f}s" for name in cpu_split.PER_RUN))
    mean = {name: statistics.mean(values) for name, values in shares.items()}
    largest = sorted(mean, key=mean.get, reverse=True)[:3]
    print("largest costs, by their mean share over the queries: "
          + ", ".join(f"{name} ({mean[name]:.0%})" for name in largest))


def benchmark(opts, scratch: str) -> int:
    cores = os.cpu_count() or 1
    flink = None
    if "flink" in opts.engines:
        flink, problem = flink_python(opts.flink_venv)
        if problem:
            log(f"Flink cannot run: {problem}. Running gearbus alone.")
            opts.engines = [engine for engine in opts.engines if engine != "flink"]
    if opts.profile and not cpu_split.py_spy():
        raise BenchError("--profile needs py-spy: pip install py-spy")
    for rate in opts.rates:
        files = write_inputs(rate, opts.events, os.path.join(scratch, "events"))
        rows, checks, split = {}, {}, {}
        for query in opts.queries:
            if opts.check:
                checks[query] = {engine: check(query, engine, files[1], opts, flink, scratch)
                                 for engine in opts.engines}
                log(f"{query}: rows vs the oracle: {checks[query]}")
            rows[query] = measure(query, files, opts, flink, scratch)
            if opts.profile:
                split[query] = profile(query, files, opts, scratch)
        print_table(rate, rows, checks, opts, cores)
        if split:
            print_profile(rate, split)
        shutil.rmtree(os.path.join(scratch, "events"), ignore_errors=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--queries", default=",".join(QUERIES), help="comma-separated queries")
    parser.add_argument("--events", type=int, default=300_000, help="N: the small file's events (the large one: 3N)")
    parser.add_argument("--rate", default="10000,100000",
                        help="events per second of event time, comma-separated: a table for each")
    parser.add_argument("--state", choices=("hashmap", "rocksdb"), default="hashmap", help="Flink's state backend")
    parser.add_argument("--parallelism", type=int, default=2, help="tasks per operator, on both engines")
    parser.add_argument("--repeat", type=int, default=1, help="measurements per query (median and spread shown)")
    parser.add_argument("--check", action="store_true", help="also hold both engines' rows against the oracle")
    parser.add_argument("--profile", action="store_true", help="also split gearbus's CPU per event by cost (py-spy)")
    parser.add_argument("--engines", default=",".join(ENGINES), help="which engines to run")
    parser.add_argument("--flink-venv", default=default_venv(), help="where PyFlink's virtual environment lives")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds allowed per run")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (printed)")
    opts = parser.parse_args(argv)
    opts.queries = [q.strip() for q in opts.queries.split(",") if q.strip()]
    opts.engines = [e.strip() for e in opts.engines.split(",") if e.strip()]
    unknown = [q for q in opts.queries if q not in QUERIES] + [e for e in opts.engines if e not in ENGINES]
    if unknown or not opts.engines:
        parser.error(f"unknown {', '.join(unknown) or 'engines'}: queries are {', '.join(QUERIES)}, "
                     f"engines {', '.join(ENGINES)}")
    try:
        opts.rates = [int(r) for r in opts.rate.split(",") if r.strip()]
    except ValueError:
        parser.error(f"--rate takes whole events per second, comma-separated, got {opts.rate!r}")
    if min([opts.events, opts.parallelism, opts.repeat, *opts.rates] or [0]) < 1:
        parser.error("--events, --parallelism, --repeat and --rate must be at least 1")
    return in_temp_dir("gearbus-nexmark-flink-", opts.keep, lambda scratch: benchmark(opts, scratch))


if __name__ == "__main__":
    sys.exit(main())
