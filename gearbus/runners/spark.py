"""The SparkRunner: a DSL pipeline translated into PySpark RDD operations.

A visitor walks the pipeline's steps in order and applies one translation per step
kind (Beam's Spark runner pattern). Records are ``(value, timestamp, key)`` tuples, as
on the bus. Aggregations combine in Spark (``combineByKey``); windows use the same
assigners and aggregators as the bus runtime, and the same late-data rule: a record is
judged against the watermark as the bus would have it when the record arrives (the
source's watermark after each batch of ``batch_records`` records). A bounded Spark job
emits final window results only: early triggers are ignored (said once at plan time).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import traceback
from collections.abc import Sequence
from urllib.parse import urlparse

from gearbus.api.aggregators import Aggregator
from gearbus.api.dsl import Pipeline, Step
from gearbus.api.graph import GraphError
from gearbus.api.task import now_ms
from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN
from gearbus.artifact import pack
from gearbus.api.windows import (
    LATE,
    ON_TIME,
    Accumulation,
    GlobalWindows,
    SessionWindows,
    WindowOperator,
    WindowResult,
)
from gearbus.connectors.files import CollectionSource, JsonLinesSink, JsonLinesSource, TextFileSource
from shared.messages import AppError, AppState

STEP_FAILURE = "gearbus step failure"
DEFAULT_BATCH_RECORDS = 4096
MASTER_CONNECT_TIMEOUT_S = 5.0


class SparkUnavailable(RuntimeError):
    """Spark cannot start here; the message says what to do."""


class StepFailure(Exception):
    """Raised inside Spark's Python workers when user code fails; its text survives the
    JVM round trip, so the driver can name the step and the record."""

    def __init__(self, step: str, value, original: BaseException):
        shown = repr(value)
        shown = shown if len(shown) <= 200 else shown[:200] + "..."
        super().__init__(f"{STEP_FAILURE} [{type(original).__name__}] {original} (step {step!r} on record {shown})")


def _guard(step: str, fn):
    """Wrap a user function so a failure names its step and value."""

    def guarded(value):
        try:
            return fn(value)
        except Exception as exc:
            raise StepFailure(step, value, exc) from exc

    return guarded


def check_java() -> None:
    """Spark needs Java 17 or newer; say so, with the fix, before anything starts."""
    java = shutil.which("java") or (os.path.join(os.environ["JAVA_HOME"], "bin", "java")
                                    if os.environ.get("JAVA_HOME") else None)
    if not java or not os.path.exists(java):
        raise SparkUnavailable("the Spark runner needs Java 17 or newer, and no java was found: install a JDK or "
                               "JRE 17+ (e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30).stderr
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SparkUnavailable(f"the Spark runner needs Java 17+, and running {java} failed: {exc}") from None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out)
    major = int(match.group(1)) if match else 0
    if major == 1 and match.group(2):
        major = int(match.group(2))
    if major < 17:
        raise SparkUnavailable(f"the Spark runner needs Java 17 or newer; {java} is version {major or 'unknown'} "
                               "(install e.g. openjdk-17-jre-headless, or set JAVA_HOME)")


def check_master(master: str) -> None:
    """A spark:// master that does not answer is a clear error within seconds."""
    if not master.startswith("spark://"):
        return
    for hostport in master.removeprefix("spark://").split(","):
        parsed = urlparse(f"spark://{hostport}")
        try:
            with socket.create_connection((parsed.hostname, parsed.port or 7077), MASTER_CONNECT_TIMEOUT_S):
                return
        except OSError:
            continue
    raise SparkUnavailable(f"no Spark master answers at {master} (tried for {MASTER_CONNECT_TIMEOUT_S:g} s)")


def spark_session(master: str = "local[*]", app_name: str = "gearbus"):
    check_java()
    check_master(master)
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # workers need this Python's packages
    session = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.shuffle.partitions", "8")
               .getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


class SparkPlan:
    """The translation of one pipeline; :meth:`run` executes its sinks."""

    def __init__(self, pipeline: Pipeline, sc, warn=print):
        self.pipeline = pipeline
        self.sc = sc
        self.batch = int(pipeline.config.get("batch_records", DEFAULT_BATCH_RECORDS))
        self.rdds: dict[Step, object] = {}
        self.watermarks: dict[Step, object] = {}  # step -> its source's watermark generator settings
        self.outputs: list[tuple[JsonLinesSink, object]] = []  # (sink, RDD of records) written by run()
        self.ingestion_ms = now_ms()
        for step in pipeline.steps:
            translate = TRANSLATIONS.get(step.kind)
            if translate is None:
                raise GraphError(f"step {step.name!r} ({step.kind}) cannot run on the spark runner")
            translate(self, step)
        early = [s.name for s in pipeline.steps if s.kind == "aggregate" and s.params.get("trigger") is not None]
        if early:
            warn(f"spark runner: early triggers of {', '.join(early)} are ignored; a bounded Spark job emits "
                 "final window results only", file=sys.stderr)

    # --- sources --------------------------------------------------------------------

    def source(self, step: Step) -> None:
        data_source = step.params["data_source"]
        if isinstance(data_source, JsonLinesSource):
            rdd = self._json_lines(step, data_source.path)
        elif isinstance(data_source, TextFileSource):
            rdd = self.sc.textFile(data_source.path, self.sc.defaultParallelism)
        elif isinstance(data_source, CollectionSource):
            rdd = self.sc.parallelize(data_source.items, self.sc.defaultParallelism)
        else:
            raise GraphError(f"step {step.name!r}: the spark runner cannot read a {type(data_source).__name__}; "
                             "it reads TextFileSource, JsonLinesSource and CollectionSource")
        if step.fn is not None:
            stamp = _guard(step.name, step.fn)
            records = rdd.map(lambda v: (v, int(stamp(v)), None))
        else:
            ts = self.ingestion_ms
            records = rdd.map(lambda v: (v, ts, None))
        self.rdds[step] = records
        self.watermarks[step] = step.params["watermarks"].max_delay_ms

    def _json_lines(self, step: Step, path: str):
        def parse(indexed):
            line, index = indexed
            try:
                return json.loads(line)
            except ValueError as exc:
                raise StepFailure(step.name, line, ValueError(f"{path}:{index + 1}: not valid JSON ({exc})")) from None

        lines = self.sc.textFile(path, self.sc.defaultParallelism).zipWithIndex()
        return lines.filter(lambda pair: pair[0].strip()).map(parse)

    # --- stateless steps --------------------------------------------------------------

    def map(self, step: Step) -> None:
        fn = _guard(step.name, step.fn)
        self._then(step, lambda rdd: rdd.map(lambda r: (fn(r[0]), r[1], r[2])))

    def flat_map(self, step: Step) -> None:
        fn = _guard(step.name, lambda v: list(step.fn(v)))
        self._then(step, lambda rdd: rdd.flatMap(lambda r: [(v, r[1], r[2]) for v in fn(r[0])]))

    def filter(self, step: Step) -> None:
        fn = _guard(step.name, step.fn)
        self._then(step, lambda rdd: rdd.filter(lambda r: fn(r[0])))

    def group_by(self, step: Step) -> None:
        fn = _guard(step.name, step.fn)
        self._then(step, lambda rdd: rdd.map(lambda r: (r[0], r[1], fn(r[0]))))

    def merge(self, step: Step) -> None:
        self.rdds[step] = self.sc.union([self.rdds[i] for i in step.inputs])
        self.watermarks[step] = None  # interleaving of several sources: no per-record watermark

    def _then(self, step: Step, transform) -> None:
        upstream = step.inputs[0]
        self.rdds[step] = transform(self.rdds[upstream])
        self.watermarks[step] = self.watermarks.get(upstream)

    # --- aggregations -----------------------------------------------------------------

    def aggregate(self, step: Step) -> None:
        p = step.params
        assigner, aggregator = p["assigner"], p["aggregator"]
        upstream = self.rdds[step.inputs[0]]
        delay = self.watermarks.get(step.inputs[0])
        if isinstance(assigner, GlobalWindows):
            results = self._global(step, upstream, aggregator)
        else:
            arrivals = self._arrival_watermarks(upstream, delay)
            if isinstance(assigner, SessionWindows):
                results = self._sessions(step, arrivals)
            else:
                results = self._windows(step, arrivals)
        self.rdds[step] = results.map(lambda res: (res, min(res.window_end - 1, WATERMARK_MAX - 1), res.key))
        self.watermarks[step] = None

    def _global(self, step: Step, rdd, aggregator: Aggregator):
        name = step.name
        make, add, merge, result = aggregator.create, aggregator.add, aggregator.merge, aggregator.result
        pairs = rdd.map(lambda r: (r[2], r[0]))

        def create(value):
            return _apply(name, add, make(), value)

        def fold(acc, value):
            return _apply(name, add, acc, value)

        if aggregator.combinable:
            combined = pairs.combineByKey(create, fold, lambda a, b: _apply(name, merge, a, b))
        else:  # no merge: fold each key's values in arrival order
            ordered = pairs.zipWithIndex().map(lambda kv_i: (kv_i[0][0], (kv_i[1], kv_i[0][1])))
            combined = ordered.groupByKey().mapValues(
                lambda values: _fold_in_order(name, add, make(), sorted(values, key=lambda iv: iv[0])))
        return combined.map(lambda kv: WindowResult(kv[0], result(kv[1]), WATERMARK_MIN, WATERMARK_MAX, ON_TIME))

    def _arrival_watermarks(self, rdd, delay):
        """Each record with the watermark in force when the bus would deliver it: the
        source's watermark after the previous batch of ``batch_records`` records."""
        indexed = rdd.zipWithIndex()
        if delay is None:
            return indexed.map(lambda ri: (ri[0], WATERMARK_MIN, ri[1]))
        batch = self.batch
        newest = dict(indexed.map(lambda ri: (ri[1] // batch, ri[0][1])).reduceByKey(max).collect())
        after, running = {}, WATERMARK_MIN
        for b in range(max(newest, default=-1) + 1):
            running = max(running, newest.get(b, WATERMARK_MIN))
            after[b] = running - delay - 1
        before = self.sc.broadcast({b: after.get(b - 1, WATERMARK_MIN) for b in after})
        return indexed.map(lambda ri: (ri[0], before.value[ri[1] // batch], ri[1]))

    def _windows(self, step: Step, arrivals):
        """Tumbling and sliding windows: late records beyond the allowed lateness are
        dropped; the rest combine per (key, window) in Spark."""
        p, name = step.params, step.name
        assign, lateness = p["assigner"].assign, p["allowed_lateness_ms"]
        agg = p["aggregator"]
        make, add, merge, result = agg.create, agg.add, agg.merge, agg.result

        def place(arrival):
            (value, ts, key), watermark = arrival[0], arrival[1]
            for window in assign(ts):
                if window.end - 1 + lateness > watermark:  # not past its allowed lateness
                    yield (key, window.start, window.end), (value, window.end - 1 <= watermark)

        def too_late(arrival):
            (_, ts, _), watermark = arrival[0], arrival[1]
            return all(window.end - 1 + lateness <= watermark for window in assign(ts))

        late_sink = p["late_sink"]
        if late_sink is not None:
            if not isinstance(late_sink, JsonLinesSink):
                raise GraphError(f"step {step.name!r}: the spark runner writes late records to a JsonLinesSink only")
            self.outputs.append((late_sink, arrivals.filter(too_late).map(lambda a: a[0])))

        def create(item):
            return [_apply(name, add, make(), item[0]), item[1]]

        def fold(acc, item):
            acc[0] = _apply(name, add, acc[0], item[0])
            acc[1] = acc[1] or item[1]
            return acc

        combined = arrivals.flatMap(place).combineByKey(
            create, fold, lambda a, b: [_apply(name, merge, a[0], b[0]), a[1] or b[1]])
        return combined.map(lambda kv: WindowResult(kv[0][0], result(kv[1][0]), kv[0][1], kv[0][2],
                                                    LATE if kv[1][1] else ON_TIME))

    def _sessions(self, step: Step, arrivals):
        """Session windows merge per key, so each key's records go, in arrival order,
        through the bus's own WindowOperator; its last pane per session is the result."""
        p = step.params
        assigner, agg, lateness, name = p["assigner"], p["aggregator"], p["allowed_lateness_ms"], step.name

        def sessions(key, items):
            op = WindowOperator(assigner, agg, None, Accumulation.ACCUMULATING, lateness)
            final = {}
            try:
                for (value, ts, _), watermark, _ in sorted(items, key=lambda item: item[2]):
                    for pane in op.process(key, value, ts, watermark):
                        final[(pane.window_start, pane.window_end)] = pane
                for pane in op.advance(WATERMARK_MAX):
                    final[(pane.window_start, pane.window_end)] = pane
            except Exception as exc:
                raise StepFailure(name, key, exc) from exc
            return list(final.values())

        return arrivals.map(lambda a: (a[0][2], a)).groupByKey().flatMap(lambda kv: sessions(kv[0], kv[1]))

    # --- sinks --------------------------------------------------------------------------

    def sink(self, step: Step) -> None:
        data_sink = step.params["data_sink"]
        if not isinstance(data_sink, JsonLinesSink):
            raise GraphError(f"step {step.name!r}: the spark runner cannot write a {type(data_sink).__name__}; "
                             "it writes JsonLinesSink")
        self.outputs.append((data_sink, self.rdds[step.inputs[0]]))

    def run(self) -> None:
        for data_sink, rdd in self.outputs:
            path = data_sink.path
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
            rdd.map(lambda r: json.dumps(r[0], ensure_ascii=False)).saveAsTextFile(path)


def _apply(step: str, fn, *args):
    try:
        return fn(*args)
    except Exception as exc:
        raise StepFailure(step, args[-1], exc) from exc


def _fold_in_order(step: str, add, acc, indexed_values):
    for _, value in indexed_values:
        acc = _apply(step, add, acc, value)
    return acc


TRANSLATIONS = {
    "source": SparkPlan.source,
    "map": SparkPlan.map,
    "flat_map": SparkPlan.flat_map,
    "filter": SparkPlan.filter,
    "group_by": SparkPlan.group_by,
    "merge": SparkPlan.merge,
    "aggregate": SparkPlan.aggregate,
    "sink": SparkPlan.sink,
}


def ship_module(sc, path: str) -> None:
    """Make the app's module importable in Spark's Python workers (its functions are
    pickled by reference): the .py file itself, or a package zipped."""
    artifact = pack(path)
    if artifact.kind == "module":
        sc.addPyFile(os.path.abspath(path))
        return
    target = os.path.join(tempfile.mkdtemp(prefix="gearbus-spark-"), f"{artifact.entry}.zip")
    with open(target, "wb") as f:
        f.write(artifact.data)
    sc.addPyFile(target)


def failure_from(exc: BaseException) -> AppError:
    """The user's error out of a Spark failure: the step and Python exception, not the JVM trace."""
    text = str(exc)
    match = re.search(re.escape(STEP_FAILURE) + r" \[(\w+)\] (.*?\(step '[^']*'.*?\))", text, re.S)
    if match:
        return AppError(match.group(1), match.group(2), "spark", text[-4000:])
    python_errors = re.findall(r"^(\w+(?:Error|Exception)): (.+)$", text, re.M)  # from a Python worker
    if python_errors:
        error_type, message = python_errors[-1]
        return AppError(error_type, message, "spark", text[-4000:])
    return AppError(type(exc).__name__, text.splitlines()[0] if text else repr(exc), "spark", traceback.format_exc())


class SparkRunner:
    """Runs a DSL pipeline on Spark (``local[*]`` by default, or a ``spark://`` master)."""

    def __init__(self, master: str = "local[*]", spark=None):
        self.master = master
        self.spark = spark

    def run(self, app, args: Sequence[str] = ()):
        from gearbus.runners import RunResult, load_pipeline

        pipeline = load_pipeline(app, args)
        spark = self.spark or spark_session(self.master, pipeline.name)
        if isinstance(app, str):
            ship_module(spark.sparkContext, app)
        plan = SparkPlan(pipeline, spark.sparkContext)
        try:
            plan.run()
        except Exception as exc:
            return RunResult(AppState.FAILED, error=failure_from(exc), name=pipeline.name)
        return RunResult(AppState.SUCCEEDED, name=pipeline.name)


__all__ = ["SparkRunner", "SparkUnavailable", "check_java", "check_master", "spark_session"]
