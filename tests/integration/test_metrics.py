"""Metrics measured where they arise (tasks), summed up per processor by the AppMaster and
served with the app's DAG by the master, on a real cluster."""

from __future__ import annotations

import os

from gearbus.artifact import pack
from shared.messages import AppState
from tests.support.paths import APPS, WORDCOUNT
from tests.support.wordcount import CORPUS_LINES, write_corpus

FAILING = os.path.join(APPS, "failing.py")


async def test_the_final_metrics_count_what_the_app_processed(client, tmp_path):
    text, output = tmp_path / "text.txt", tmp_path / "counts.jsonl"
    words = write_corpus(text)
    app_id = await client.submit(pack(WORDCOUNT), ["--input", str(text), "--output", str(output),
                                                   "--combine-keys", "1"])
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.SUCCEEDED, final.error

    dag = final.dag
    assert [(p.name, p.parallelism) for p in dag.processors] == [("read+split+by_word", 2), ("count+format", 2),
                                                                   ("write", 1)]
    assert [(e.source, e.target, e.partitioner) for e in dag.edges] == [(0, 1, "HashPartitioner"),
                                                                         (1, 2, "ShufflePartitioner")]
    split, count, write = final.processors
    assert [m.name for m in final.processors] == [p.name for p in dag.processors]
    assert split.records_in == CORPUS_LINES  # the source's lines
    assert count.records_in == split.records_out > 0  # nothing lost on the edge
    assert count.records_out == write.records_in == len(words)  # one count per distinct word
    assert count.bytes_in == split.bytes_out > 0 and write.bytes_in == count.bytes_out > 0
    assert (split.finished_tasks, count.finished_tasks, write.finished_tasks) == (2, 2, 1)
    assert split.latency_p99_ms is not None and count.latency_p50_ms is not None
    assert split.watermark_lag_ms is None  # every task ended

    tasks = {(t.task.processor, t.task.index): t for t in final.tasks}
    assert sum(t.records_in for key, t in tasks.items() if key[0] == 1) == count.records_in
    for t in tasks.values():
        assert sum(t.batch_ms_buckets) > 0 and t.busy_ms > 0
        assert t.inbox_depth == 0 and t.backpressure_ms >= 0


async def test_a_failed_app_counts_what_its_tasks_processed_before_the_failure(client):
    """The task fails well before its executor's next heartbeat: the figures come with the failure."""
    records = 500
    app_id = await client.submit(pack(FAILING), [str(records - 1), str(records)])  # it fails on the last record
    final = await client.wait(app_id, timeout=60)
    assert final.state == AppState.FAILED and final.error.message == f"cannot handle record {records - 1}"
    numbers, picky = final.processors
    assert picky.records_in == records, final.processors
    assert numbers.records_in == numbers.records_out == records, final.processors  # the same executor's source
