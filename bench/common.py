"""What the benchmarks share: their command-line help and the check of counted output."""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown, and the module docstring kept as written."""


def parser_from_doc(doc: str) -> argparse.ArgumentParser:
    """A parser whose description is the docstring's first paragraph and whose epilog is
    everything after its second (the usage block)."""
    return argparse.ArgumentParser(description=doc.split("\n\n")[0], formatter_class=HelpFormatter,
                                   epilog=doc.split("\n\n", 2)[2])


def count_problems(got: dict, expected: collections.Counter, what: str) -> list[str]:
    """What differs between counted output and the independent count, a few of each kind."""
    problems = []
    missing = [k for k in expected if k not in got]
    extra = [k for k in got if k not in expected]
    wrong = [k for k in expected if k in got and got[k] != expected[k]]
    if missing:
        problems.append(f"{len(missing)} {what} missing, e.g. " + ", ".join(f"{k}={expected[k]}" for k in missing[:5]))
    if extra:
        problems.append(f"{len(extra)} unexpected {what}, e.g. " + ", ".join(f"{k}={got[k]}" for k in extra[:5]))
    if wrong:
        problems.append(f"{len(wrong)} wrong counts, e.g. "
                        + ", ".join(f"{k}: got {got[k]} want {expected[k]}" for k in wrong[:5]))
    return problems


class BenchError(Exception):
    """The benchmark cannot go on: a run failed or its output is wrong."""


def gearbus_command() -> list[str]:
    script = os.path.join(os.path.dirname(sys.executable), "gearbus")
    if os.path.isfile(script) and os.access(script, os.X_OK):
        return [script]
    return [sys.executable, "-m", "gearbus.cli"]


def run_app(app: str, app_args: list[str], timeout: float, scratch: str, runner_args: tuple[str, ...] = ()) -> dict:
    """``gearbus run --json APP ARGS`` once (the embedded cluster unless ``runner_args``
    say otherwise); the JSON summary (its phases: start-up = submit to ACTIVE, running =
    ACTIVE to SUCCEEDED) plus ``wall_s`` (start to exit) and ``stderr``.

    The run's TMPDIR is ``scratch``, so what gearbus puts in temp directories (process logs,
    the JetStream store, unpacked artifacts) goes with the benchmark's own. Any failure
    raises BenchError."""
    os.makedirs(scratch, exist_ok=True)
    cmd = gearbus_command() + ["run", "--json", *runner_args, app, *app_args]
    env = dict(os.environ, TMPDIR=scratch)
    started = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired as exc:
        raise BenchError(f"gearbus run did not finish within {timeout:g} s\n"
                         f"stderr:\n{_text(exc.stderr)}") from None
    wall = time.perf_counter() - started
    summary = None
    for line in proc.stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                summary = json.loads(line)
            except ValueError:
                continue
    if proc.returncode != 0 or summary is None or summary.get("state") != "SUCCEEDED":
        raise BenchError(f"gearbus run failed (exit {proc.returncode})\n"
                         f"command: {' '.join(cmd)}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}")
    summary["wall_s"] = wall
    summary["stderr"] = proc.stderr.strip()
    return summary


def _text(data) -> str:
    if data is None:
        return ""
    return data.decode(errors="replace") if isinstance(data, bytes) else data


def in_temp_dir(prefix: str, keep: bool, work: Callable[[str], int]) -> int:
    """``work(directory)`` in a fresh temporary directory, removed afterwards unless ``keep``
    (its logs and data are then there to read); a BenchError is reported and exits 1."""
    tmp = tempfile.mkdtemp(prefix=prefix)
    try:
        return work(tmp)
    except BenchError as exc:
        print(f"\nFAILED: {exc}", file=sys.stderr)
        return 1
    finally:
        if keep:
            print(f"(kept {tmp})", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def embedded_cluster(tmp: str, workers: int = 2, slots: int = 4):
    """A nats-server with its JetStream store under ``tmp`` and a LocalCluster of
    ``workers`` on it (logs under ``tmp/logs``), both stopped afterwards: (server, cluster)."""
    from gearbus.cluster import LocalCluster
    from gearbus.natsserver import NatsServer

    store = os.path.join(tmp, "jetstream")
    os.makedirs(store)
    server = NatsServer(store_dir=store, log_path=os.path.join(tmp, "nats-server.log"))
    server.start()
    cluster = LocalCluster(workers=workers, slots=slots, log_dir=os.path.join(tmp, "logs"), nats=server)
    try:
        cluster.start()
        yield server, cluster
    finally:
        cluster.stop()
        server.stop()
