"""The examples on the SparkRunner (local Spark, and a real standalone Spark cluster),
checked against the same independent computations as on the bus runners."""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import time

import pytest

from gearbus.natsserver import free_port
from gearbus.runners import TestRunner
from gearbus.runners.spark import SparkRunner, SparkUnavailable, check_master, spark_session
from shared.messages import AppState
from tests.support.examples import (
    MINUTE,
    clicks,
    expected_pageviews,
    expected_sensors,
    expected_sessions,
    pageview_events,
    sensor_readings,
)
from tests.support.files import canonical, read_jsonl, write_jsonl
from tests.support.paths import EXAMPLES, REPO
from tests.support.services import CustomerService, expected_enriched, orders

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark():
    return spark_session("local[2]")


def run(spark, example: str, args: list[str]):
    result = SparkRunner(spark=spark).run(os.path.join(EXAMPLES, example), args)
    assert result.state == AppState.SUCCEEDED, result.error
    return result


@pytest.mark.parametrize("stages", [[], ["--stages"]], ids=["one_stage", "intermediate_stream"])
def test_wordcount(spark, tmp_path, stages):
    """With --stages the count reads an intermediate stream: one stage on Spark (a shuffle)."""
    source, output = tmp_path / "in.txt", tmp_path / "out"
    lines = ["a b  c", "", "naïve 日本語 😀", "b c c", "   "] * 300
    source.write_text("\n".join(lines), encoding="utf-8")
    run(spark, "wordcount.py", ["--input", str(source), "--output", str(output), *stages])
    expected = collections.Counter(w for line in lines for w in line.split())
    assert canonical(read_jsonl(output)) == canonical([{"word": w, "count": n} for w, n in expected.items()])


def test_pageviews_final_results_match_the_bus(spark, tmp_path):
    events = pageview_events(3000)
    source, output = write_jsonl(tmp_path / "events.jsonl", events), tmp_path / "out"
    run(spark, "pageviews.py", ["--input", source, "--output", str(output)])
    rows = read_jsonl(output)
    assert all(r["final"] for r in rows)  # no early panes on Spark: one final row per window

    def totals(rs):
        sums = collections.Counter()
        for r in rs:
            sums[(r["member"], r["window_start"], r["window_end"])] += r["count"]
        return dict(sums)

    assert totals(rows) == totals(expected_pageviews(events))
    assert len(rows) == len(totals(rows))


def test_sensors_final_results_and_late_records_match_the_bus(spark, tmp_path):
    readings = sensor_readings()
    source, output, late = write_jsonl(tmp_path / "r.jsonl", readings), tmp_path / "avg", tmp_path / "late"
    run(spark, "sensors.py", ["--input", source, "--output", str(output), "--max-delay-ms", "5000",
                              "--allowed-lateness-ms", "60000", "--late-output", str(late), "--batch-records", "200"])
    rows, dropped = expected_sensors(readings, 5000, 60_000, 200)
    final = {}
    for row in rows:  # the bus's last pane per window is its final answer
        final[(row["sensor"], row["window_start"])] = row
    got = read_jsonl(output)
    for row in got:
        row["avg"] = round(row["avg"], 6)
    assert canonical(got) == canonical(list(final.values()))
    assert canonical(read_jsonl(late)) == canonical(dropped)
    assert all(r["window_end"] - r["window_start"] == MINUTE for r in got)


def test_sessions(spark, tmp_path):
    events = clicks()
    source, output = write_jsonl(tmp_path / "clicks.jsonl", events), tmp_path / "out"
    run(spark, "sessions.py", ["--input", source, "--output", str(output)])
    assert canonical(read_jsonl(output)) == canonical(expected_sessions(events, 30_000))


def test_enrich_calls_the_service_from_every_partition_keeping_their_order(spark, tmp_path, nats_server):
    items = orders(2000)
    source, output = write_jsonl(tmp_path / "orders.jsonl", items), tmp_path / "out"
    args = ["--input", source, "--nats", nats_server.url, "--concurrency", "20"]
    with CustomerService(nats_server.url) as service:
        run(spark, "enrich.py", args + ["--output", str(output)])
        assert service.requests == len(items)
        failed = SparkRunner(spark=spark).run(os.path.join(EXAMPLES, "enrich.py"),
                                              args + ["--output", str(tmp_path / "never"), "--service", "nobody"])
    assert read_jsonl(output) == expected_enriched(items)  # each partition's part file in input order
    assert failed.state == AppState.FAILED and failed.error.error_type == "NoRespondersError"
    assert "(step 'customer' on record {'id': " in failed.error.message


def test_a_raising_user_function_names_the_step_and_the_python_exception(spark, tmp_path):
    app = tmp_path / "raising.py"
    app.write_text(
        "from gearbus import Pipeline\n"
        "def divide(n):\n    return 1 // (n - 42)\n"
        "def application(args):\n"
        "    p = Pipeline('raising')\n"
        "    p.from_collection(range(100)).map(divide, name='divide').write_jsonl(args[0])\n"
        "    return p\n")
    result = SparkRunner(spark=spark).run(str(app), [str(tmp_path / "out")])
    assert result.state == AppState.FAILED
    assert result.error.error_type == "ZeroDivisionError"
    assert "step 'divide' on record 42" in result.error.message
    assert "org.apache" not in result.error.message


def test_relative_paths_are_the_submitters_directory_as_on_the_test_runner(spark, tmp_path, monkeypatch):
    """Spark's JVM started in another directory (the first test's); the paths are this one's."""
    user = tmp_path / "user"
    user.mkdir()
    (user / "halving.py").write_text(
        "from gearbus import Pipeline\n"
        "def application(args):\n"
        "    p = Pipeline('halving')\n"
        "    p.read_jsonl(args[0], name='numbers').map(lambda n: n / 2, name='half').write_jsonl(args[1], name='out')\n"
        "    return p\n")
    write_jsonl(user / "in.jsonl", range(100))
    monkeypatch.chdir(user)
    assert SparkRunner(spark=spark).run("halving.py", ["in.jsonl", "spark-out"]).state == AppState.SUCCEEDED
    assert TestRunner().run("halving.py", ["in.jsonl", "test-out.jsonl"]).succeeded
    halves = [n / 2 for n in range(100)]
    assert sorted(read_jsonl(user / "spark-out")) == sorted(read_jsonl(user / "test-out.jsonl")) == halves


def test_an_unreachable_master_is_a_clear_error(tmp_path):
    with pytest.raises(SparkUnavailable, match="no Spark master answers at spark://127.0.0.1"):
        check_master(f"spark://127.0.0.1:{free_port()}")


def test_no_java_says_spark_needs_java_17(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "JAVA_HOME"} | {"PATH": str(bin_dir)}
    done = subprocess.run([sys.executable, "-m", "gearbus.cli", "run", "--runner", "spark",
                           os.path.join(EXAMPLES, "wordcount.py"), "--input", os.path.join(EXAMPLES, "data", "sample.txt"),
                           "--output", str(tmp_path / "out")], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "needs Java 17 or newer" in done.stderr and "openjdk-17" in done.stderr


def test_wordcount_on_a_standalone_spark_cluster(tmp_path):
    """A real Spark master and worker from the pyspark installation, on loopback."""
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    port = free_port()
    env = dict(os.environ, SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1", PYSPARK_PYTHON=sys.executable)
    logs = open(tmp_path / "spark.log", "wb")
    master = subprocess.Popen([spark_class, "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1",
                               "--port", str(port), "--webui-port", str(free_port())], env=env, stdout=logs,
                              stderr=logs)
    worker = subprocess.Popen([spark_class, "org.apache.spark.deploy.worker.Worker", f"spark://127.0.0.1:{port}",
                               "--host", "127.0.0.1", "--cores", "2", "--memory", "1g",
                               "--webui-port", str(free_port()), "--work-dir", str(tmp_path / "work")],
                              env=env, stdout=logs, stderr=logs)
    try:
        deadline = time.monotonic() + 60
        while True:  # the JVM takes a few seconds to listen; a Spark master has no readiness signal
            try:
                check_master(f"spark://127.0.0.1:{port}")
                break
            except SparkUnavailable:
                assert time.monotonic() < deadline and master.poll() is None, (tmp_path / "spark.log").read_text()
                time.sleep(0.2)  # polling a port: the master has no readiness signal to wait on
        source, output = tmp_path / "in.txt", tmp_path / "out"
        lines = ["the quick brown fox", "jumps over the lazy dog", ""] * 500
        source.write_text("\n".join(lines), encoding="utf-8")
        done = subprocess.run([sys.executable, "-m", "gearbus.cli", "run", "--runner", "spark", "--spark-master",
                               f"spark://127.0.0.1:{port}", os.path.join(EXAMPLES, "wordcount.py"),
                               "--input", str(source), "--output", str(output)],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
        assert done.returncode == 0, done.stderr[-3000:] + (tmp_path / "spark.log").read_text()[-3000:]
        expected = collections.Counter(w for line in lines for w in line.split())
        assert canonical(read_jsonl(output)) == canonical([{"word": w, "count": n} for w, n in expected.items()])
    finally:
        for process in (worker, master):
            process.terminate()
            process.wait(30)
        shutil.rmtree(tmp_path / "work", ignore_errors=True)
