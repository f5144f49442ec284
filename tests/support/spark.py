"""One local Spark session per test process, shared by every test that needs Spark.

Starting a SparkSession costs seconds (a JVM), so tests call ``shared_spark()`` instead of
building their own: the first call creates it, later calls return the same one, and it is
stopped when the process exits. Tests must not stop it or change session-wide settings
they do not restore.
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

_lock = threading.Lock()
_session = None


def shared_spark():
    """The process's local[2] SparkSession (no UI, 2 shuffle partitions, UTC, loopback only)."""
    global _session
    with _lock:
        if _session is not None and _session.sparkContext._jsc is not None:
            return _session
        # Python workers must run this interpreter (the venv with gearbus, nats-py, pyarrow).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        from pyspark.sql import SparkSession

        _session = (
            SparkSession.builder.master("local[2]")
            .appName("gearbus-tests")
            .config("spark.ui.enabled", "false")
            .config("spark.sql.shuffle.partitions", "2")
            .config("spark.default.parallelism", "2")
            .config("spark.sql.session.timeZone", "UTC")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
            .getOrCreate()
        )
        _session.sparkContext.setLogLevel("ERROR")
        atexit.register(_stop)
        return _session


def _stop() -> None:
    global _session
    with _lock:
        if _session is not None:
            try:
                _session.stop()
            except Exception:  # noqa: BLE001 - the JVM may already be gone at exit
                pass
            _session = None
