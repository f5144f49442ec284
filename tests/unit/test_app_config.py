"""The typed application config: every key's check, the nearest key suggested, the docs'
table kept in step, and a bad config failing where the app is planned, on every runner."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest

from gearbus import Pipeline
from gearbus.api.graph import GraphError
from gearbus.artifact import load_local
from gearbus.connectors.files import CollectSink
from gearbus.control.config import (BACKEND_ENV, DEBLOAT_TARGET_MS, AppConfig, ConfigError, documented_default,
                                    internal_keys, user_keys)
from gearbus.planner import plan
from gearbus.runners import TestRunner
from gearbus.runners.spark import SparkRunner
from tests.support.paths import APPS, REPO

#: key: (values it takes, values it refuses, what the refusal says is allowed)
CHECKS = {
    "executors": ([1, 8], [0, -1, 1.5, True, "2", None], "an integer >= 1"),
    "task_placement": (["by_index", "round_robin"], ["spread", 1], "one of by_index, round_robin"),
    "max_restarts": ([0, 10], [-1, 2.0], "an integer >= 0"),
    "blacklist_after": ([1, 5], [0], "an integer >= 1"),
    "appmaster_restarts": ([0, 3], [-1, "3"], "an integer >= 0"),
    "appmaster_timeout_s": ([0.5, 30], [0, -1, float("inf"), float("nan"), "30"], "a positive number"),
    "stall_timeout_s": ([1, 2.5], [0, -0.1, False], "a positive number"),
    "batch_records": ([1, 4096], [0, 10.0], "an integer >= 1"),
    "batch_bytes": ([1, 1 << 20], [0, -5], "an integer >= 1"),
    "linger_ms": ([0, 2.5], [-1, float("inf")], "a non-negative number"),
    "credit_frames": ([2, 64], [1, 0], "an integer >= 2"),
    "debloat_target_ms": ([0, 250, None], [-1, float("nan"), "100"], "a non-negative number"),
    "task_metrics": ([True, False], [1, "true", None], "true or false"),
    "combine_keys": ([1, 100_000], [0, -1], "an integer >= 1"),
    "checkpoint_interval_ms": ([0, 1000], [-1, 0.5], "an integer >= 0"),
    "incremental_checkpoints": ([True, False], [0], "true or false"),
    "local_copies": ([True, False], ["no"], "true or false"),
    "checkpoint_timeout_ms": ([1, 60_000], [0, -1], "an integer >= 1"),
    "checkpoints_kept": ([1, 3], [0], "an integer >= 1"),
    "checkpoint_failures_tolerated": ([0, 10], [-1], "an integer >= 0"),
    "intermediate_streams": (["none", "all"], ["some", True], "'all' or 'none'"),
    "intermediate_stream_partitions": ([1, 128, None], [0, 129, True], "an integer from 1 to 128"),
    "intermediate_stream_max_bytes": ([-1, 1, 1 << 30], [0, -2], "-1 (unbounded) or an integer >= 1"),
    "state_backend": (["memory", "rocksdb", None], ["no-such-backend", "", "lmdb"], "one of memory, rocksdb"),
    "placement": (["any", "one_worker"], ["everywhere"], "one of any, one_worker, worker"),
    "worker_id": (["worker-0", ""], [0], "a string"),
    "timeout_s": ([0, 2.5], [-1], "a non-negative number"),
    "stage": ([0, 3, None], [-1, "1"], "an integer >= 0"),
    "from_savepoint": (["sp-1", ""], [1, "a b", "x" * 65], "a savepoint name (1-64 letters, digits, '-' or '_')"),
    "allow_unclaimed_state": ([True, False], ["yes"], "true or false"),
}


def test_every_key_is_checked_here():
    assert set(CHECKS) == {f.name for f in dataclasses.fields(AppConfig)}


@pytest.mark.parametrize("name", list(CHECKS))
def test_each_key_takes_what_it_allows_and_refuses_the_rest_naming_key_value_and_rule(name):
    good, bad, allowed = CHECKS[name]
    for value in good:
        assert getattr(AppConfig.parse({name: value}), name) == value
    for value in bad:
        with pytest.raises(ConfigError) as refused:
            AppConfig.parse({name: value})
        assert str(refused.value) == f"application config {name} must be {allowed}, got {value!r}"


def test_an_empty_config_is_every_default():
    assert AppConfig.parse({}) == AppConfig()


def test_an_unknown_key_is_refused_with_the_nearest_known_one_or_the_list():
    with pytest.raises(ConfigError, match=r"unknown application config key 'chekpoint_interval_ms': did you mean "
                                          r"'checkpoint_interval_ms'\?$"):
        AppConfig.parse({"executors": 2, "chekpoint_interval_ms": 5})
    with pytest.raises(ConfigError, match=r"unknown application config key 'zzz': the keys are executors, "):
        AppConfig.parse({"zzz": 1})
    with pytest.raises(ConfigError, match="unknown application config key 7"):
        AppConfig.parse({7: 1})


def test_a_plug_in_types_own_keys_pass_unchecked_and_gearbus_keys_are_still_checked():
    assert AppConfig.parse({"my_type_knob": 3, "appmaster_restarts": 5}, strict=False).appmaster_restarts == 5
    with pytest.raises(ConfigError, match="appmaster_restarts must be an integer >= 0"):
        AppConfig.parse({"my_type_knob": 3, "appmaster_restarts": -5}, strict=False)


def test_a_config_that_is_not_a_mapping_or_contradicts_itself_is_refused():
    with pytest.raises(ConfigError, match="must be a mapping of keys to values, got list"):
        AppConfig.parse([("executors", 2)])
    with pytest.raises(ConfigError, match="placement 'worker' needs worker_id"):
        AppConfig.parse({"placement": "worker"})
    assert AppConfig.parse({"placement": "worker", "worker_id": "worker-1"}).worker_id == "worker-1"


def test_where_it_runs_the_backend_is_the_apps_else_the_hosts_and_the_debloat_target_follows(monkeypatch):
    monkeypatch.delenv(BACKEND_ENV, raising=False)
    assert AppConfig().resolved().state_backend == "memory"
    monkeypatch.setenv(BACKEND_ENV, "rocksdb")
    here = AppConfig().resolved()
    assert (here.state_backend, here.debloat_target_ms) == ("rocksdb", DEBLOAT_TARGET_MS["rocksdb"])
    assert AppConfig.parse({"state_backend": "memory", "debloat_target_ms": 7}).resolved().debloat_target_ms == 7
    monkeypatch.setenv(BACKEND_ENV, "disk")
    with pytest.raises(ConfigError, match=f"{BACKEND_ENV} must be one of memory, rocksdb, got 'disk'"):
        AppConfig().resolved()


def _documented() -> list[tuple[str, str]]:
    """(key, default) of each row of the table under docs/operations.md's "Application config"."""
    with open(os.path.join(REPO, "docs", "operations.md"), encoding="utf-8") as f:
        section = f.read().split("## Application config", 1)[1].split("\n## ", 1)[0]
    return [(m[1], m[2].strip()) for m in re.finditer(r"^\| `(\w+)` \| ([^|]*) \|", section, re.M)]


def test_the_docs_table_lists_every_users_key_with_its_default_in_order():
    assert _documented() == [(f.name, documented_default(f)) for f in user_keys()]


def test_the_docs_name_the_keys_gearbus_sets_itself():
    with open(os.path.join(REPO, "docs", "operations.md"), encoding="utf-8") as f:
        section = f.read().split("## Application config", 1)[1].split("\n## ", 1)[0]
    assert internal_keys() == ["stage", "from_savepoint", "allow_unclaimed_state"]
    assert all(f"`{name}`" in section for name in internal_keys())


def pipeline(config: dict) -> Pipeline:
    p = Pipeline("configured", config=config)
    p.from_collection(range(3), name="numbers").sink(CollectSink(), name="out")
    return p


BAD = {"state_backend": "no-such-backend"}
MESSAGE = "application config state_backend must be one of memory, rocksdb, got 'no-such-backend'"


@pytest.mark.parametrize("runner", ["test", "local", "cluster"])
def test_a_pipeline_with_a_bad_config_fails_when_it_is_planned(runner):
    with pytest.raises(GraphError, match=MESSAGE):
        plan(pipeline(BAD), runner)


def test_the_test_runner_and_the_spark_runner_refuse_it_before_running_anything():
    with pytest.raises(ConfigError, match=MESSAGE):
        TestRunner().run(pipeline(BAD))
    with pytest.raises(ConfigError, match=MESSAGE):
        SparkRunner().run(pipeline(BAD))  # before a Spark session starts (which needs Java)


def test_an_application_file_with_a_bad_config_fails_when_it_is_built_here():
    with pytest.raises(ConfigError, match="did you mean 'checkpoint_interval_ms'"):
        load_local(os.path.join(APPS, "configured.py"), ['{"chekpoint_interval_ms": 5}', "out.jsonl"])


def test_a_low_level_application_is_checked_too(tmp_path):
    app = tmp_path / "low_level.py"
    app.write_text("from gearbus import Application, Graph, Processor, Task\n"
                   "from gearbus.connectors.generator import RateSource\n"
                   "class Discard(Task):\n"
                   "    def on_next(self, record):\n"
                   "        pass\n"
                   "def application(args):\n"
                   "    graph = Graph()\n"
                   "    graph.connect(Processor.source(RateSource(rate=1), name='n'), Processor(Discard, name='d'))\n"
                   "    return Application('low', graph, config={'executors': 0})\n")
    with pytest.raises(ConfigError, match="executors must be an integer >= 1, got 0"):
        load_local(str(app), [])
