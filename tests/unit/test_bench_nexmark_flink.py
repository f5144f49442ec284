"""The pure parts of the Nexmark-beside-Flink benchmark: the Flink job's table matches the
events file, its changelog is applied as the oracle's rows, and the profile's samples land
in the cost they belong to. (The benchmark itself runs Flink and is not part of the tests.)"""

from __future__ import annotations

import json
import re

import pytest

from bench import cpu_split, flink_job
from gearbus.nexmark import COLUMNS

pytestmark = pytest.mark.unit

EXECUTOR = 'process 7:"python -P -m services.executor --nats nats://127.0.0.1:4222"'
MASTER = 'process 5:"python -P -m services.master --master-id master-0"'


def stack(*frames: str, process: str = EXECUTOR) -> list[str]:
    return ['process 1:""', process, "main (services/executor/executor.py:380)", *frames]


def test_the_flink_table_has_the_events_files_columns_for_every_kind():
    for kind, columns in COLUMNS.items():
        declared = re.search(rf"\b{kind} ROW<([^>]*)>", flink_job.EVENTS_DDL).group(1)
        names = [field.split()[0].strip("`") for field in declared.split(",")]
        assert names == list(columns), kind


def test_every_query_the_oracle_knows_has_flink_sql():
    from tests.support.nexmark import QUERIES as ORACLE

    assert set(flink_job.QUERIES) == set(ORACLE)


def test_sink_columns_keep_types_with_commas_whole():
    assert flink_job.sink_columns("q1") == ["auction", "bidder", "price", "dateTime", "extra"]
    assert flink_job.sink_columns("q8") == ["id", "name", "stime"]


def test_a_debezium_changelog_is_applied_to_the_final_rows(tmp_path):
    changes = [
        {"before": None, "after": {"id": 10, "final": 5}, "op": "c"},
        {"before": None, "after": {"id": 11, "final": 7}, "op": "c"},
        {"before": {"id": 10, "final": 5}, "after": None, "op": "d"},
        {"before": None, "after": {"id": 10, "final": 9}, "op": "c"},
    ]
    (tmp_path / "part-a-0-0").write_text("".join(json.dumps(c) + "\n" for c in changes[:3]))
    (tmp_path / "part-a-1-0").write_text(json.dumps(changes[3]) + "\n")
    (tmp_path / ".part-a-1-1.inprogress").write_text(json.dumps(changes[0]) + "\n")  # uncommitted: not read
    rows = flink_job.final_rows("q4", str(tmp_path))
    assert sorted(rows, key=lambda r: r["id"]) == [{"id": 10, "final": 9}, {"id": 11, "final": 7}]


def test_a_retraction_of_a_row_never_added_is_an_error(tmp_path):
    (tmp_path / "part-a-0-0").write_text(json.dumps({"before": {"id": 1, "final": 2}, "after": None}) + "\n")
    with pytest.raises(RuntimeError, match="retracts a row it never added"):
        flink_job.final_rows("q4", str(tmp_path))


def test_flink_timestamps_become_epoch_milliseconds_and_other_values_stay():
    assert flink_job.plain("2024-01-01 00:00:00") == 1_704_067_200_000
    assert flink_job.plain("2024-01-01 00:00:01.234") == 1_704_067_201_234
    assert flink_job.plain("2024-01-01T00:00:01.5") == 1_704_067_201_500
    assert flink_job.plain("Cheyenne") == "Cheyenne"
    assert flink_job.plain(51816.836) == 51816.836


@pytest.mark.parametrize("frames, process, expected", [
    (["DataSourceTask.read (gearbus/api/io_tasks.py:38)", "JsonLinesSource._parse (gearbus/connectors/files.py:199)",
      "JSONDecoder.raw_decode (json/decoder.py:353)"], EXECUTOR, "reading+JSON"),
    (["EventsFileSource._parse (gearbus/nexmark/sources.py:156)", "problem (gearbus/nexmark/schema.py:44)"],
     EXECUTOR, "schema checks"),
    (["ChainTask.on_batch (gearbus/runtime/chain.py:452)", "MapOp.process (gearbus/runtime/chain.py:164)",
      "seller (q3.py:35)"], EXECUTOR, "user functions"),
    (["ChainTask.on_batch (gearbus/runtime/chain.py:452)", "OfKind.__call__ (gearbus/nexmark/sources.py:36)"],
     EXECUTOR, "user functions"),
    (["seller (q3.py:35)", "loads (json/__init__.py:346)"], EXECUTOR, "reading+JSON"),
    (["WindowOperator._add_to_window (gearbus/runtime/windows.py:305)"], EXECUTOR, "engine per record"),
    (["Sender.flush (gearbus/runtime/sender.py:80)", "encode_frame (gearbus/runtime/frames.py:44)",
      "packb (msgpack/__init__.py:36)"], EXECUTOR, "frame codec"),
    (["Sender.flush (gearbus/runtime/sender.py:80)", "Client.publish (nats/aio/client.py:900)"], EXECUTOR, "bus"),
    (["TaskCore._snapshot (gearbus/runtime/core.py:312)", "packb (msgpack/__init__.py:36)"], EXECUTOR,
     "checkpoints"),
    (["DataSinkTask.on_batch (gearbus/api/io_tasks.py:72)", "DiscardSink.write (gearbus/connectors/files.py:430)"],
     EXECUTOR, "sink"),
    (["Master.on_heartbeat (services/master/master.py:300)"], MASTER, cpu_split.CONTROL_PLANE),
    (["_find_and_load (<frozen importlib._bootstrap>:1176)", "_create_fn (dataclasses.py:433)"], EXECUTOR,
     cpu_split.START_UP),
])
def test_a_sample_lands_in_the_cost_its_frames_belong_to(frames, process, expected):
    assert cpu_split.category(stack(*frames, process=process)) == expected


def test_a_thread_outside_the_engine_is_other():
    assert cpu_split.category([EXECUTOR, "_bootstrap (threading.py:1002)",
                               "_worker (concurrent/futures/thread.py:81)"]) == "other"


def test_a_raw_profile_is_counted_per_category(tmp_path):
    raw = tmp_path / "profile.txt"
    raw.write_text(";".join(stack("JSONDecoder.raw_decode (json/decoder.py:353)")) + " 7\n"
                   + ";".join(stack("Master.tick (services/master/master.py:1)", process=MASTER)) + " 3\n"
                   + ";".join(stack("JSONDecoder.raw_decode (json/decoder.py:353)")) + " 2\n")
    assert cpu_split.split(str(raw)) == {"reading+JSON": 9, "control plane": 3}
