"""Partitioners route each record to the right downstream task."""

import subprocess
import sys

import pytest

from gearbus import BroadcastPartitioner, CoLocationPartitioner, HashPartitioner, Partitioner, Record, ShufflePartitioner


def records(values, keyed=False):
    return [Record(v, 0, v if keyed else None) for v in values]


def test_hash_sends_equal_keys_to_one_task():
    batch = records(["a", "b", "a", "c", "b"] * 10, keyed=True)
    buckets = HashPartitioner().route(batch, 3, 0)
    owner = {r.key: i for i, bucket in enumerate(buckets) for r in bucket}
    assert all(owner[r.key] == i for i, bucket in enumerate(buckets) for r in bucket)
    assert sum(map(len, buckets)) == len(batch)


@pytest.mark.parametrize("seed_env", [{"PYTHONHASHSEED": "0"}, {}], ids=["fixed seed", "randomized"])
def test_hash_routing_agrees_across_processes(seed_env):
    """Workers fix the seed; without it the partitioner falls back to a stable CRC."""
    code = ("from gearbus import HashPartitioner, Record;"
            "print([HashPartitioner().partition(Record(0, 0, w), 7, 0) for w in 'abcdefghijklmnop'])")
    outputs = {
        subprocess.run([sys.executable, "-c", code], env=seed_env, capture_output=True, text=True,
                       check=True).stdout
        for _ in range(3)
    }
    assert len(outputs) == 1


def test_shuffle_is_round_robin_across_batches():
    partitioner = ShufflePartitioner()
    first = partitioner.route(records(range(5)), 2, 0)
    second = partitioner.route(records(range(5, 10)), 2, 0)
    sizes = [len(a) + len(b) for a, b in zip(first, second)]
    assert sizes == [5, 5]


def test_broadcast_and_colocation():
    batch = records(range(4))
    assert BroadcastPartitioner().route(batch, 3, 1) == [batch, batch, batch]
    assert CoLocationPartitioner().route(batch, 3, 2) == [[], [], batch]


def test_a_custom_partitioner_out_of_range_is_a_clear_error():
    class Bad(Partitioner):
        def partition(self, record, num_partitions, current_index):
            return num_partitions

    with pytest.raises(ValueError, match="Bad.partition returned 2, outside 0..1"):
        Bad().route(records([1]), 2, 0)
