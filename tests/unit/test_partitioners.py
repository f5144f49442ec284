"""Partitioners route each record to the right downstream task."""

import subprocess
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gearbus import BroadcastPartitioner, CoLocationPartitioner, HashPartitioner, Partitioner, Record, ShufflePartitioner
from gearbus.api import partitioners
from gearbus.api.partitioners import MAX_PARALLELISM, group_owner, key_group, key_groups, key_owner, owned_groups


def records(values, keyed=False):
    return [Record(v, 0, v if keyed else None) for v in values]


def test_hash_sends_equal_keys_to_one_task():
    batch = records(["a", "b", "a", "c", "b"] * 10, keyed=True)
    buckets = HashPartitioner().route(batch, 3, 0)
    owner = {r.key: i for i, bucket in enumerate(buckets) for r in bucket}
    assert all(owner[r.key] == i for i, bucket in enumerate(buckets) for r in bucket)
    assert sum(map(len, buckets)) == len(batch)


@pytest.mark.parametrize("parallelism", range(1, MAX_PARALLELISM + 1))
def test_each_task_owns_one_contiguous_range_of_key_groups(parallelism):
    """Every key group has one owner, and task i owns groups ceil(i*128/n) .. ceil((i+1)*128/n) - 1:
    so a task restored at another parallelism reads the state of a few neighbours only."""
    ranges = [owned_groups(index, parallelism) for index in range(parallelism)]
    assert [group for groups in ranges for group in groups] == list(range(MAX_PARALLELISM))
    assert all(group_owner(group, parallelism) == index for index, groups in enumerate(ranges) for group in groups)
    assert {len(groups) for groups in ranges} <= {MAX_PARALLELISM // parallelism, -(-MAX_PARALLELISM // parallelism)}


@pytest.mark.parametrize("by_key", [False, True])
def test_hash_routing_sends_a_key_to_the_owner_of_its_key_group(by_key):
    batch = [Record(v, 0, None if v % 3 == 0 else ("k", v)) for v in range(500)]
    partitioner = HashPartitioner(by_key)
    buckets = partitioner.route(batch, 5, 0)
    assert all(key_owner(r.key if r.key is not None or by_key else r.value, 5) == i == partitioner.partition(r, 5, 0)
               for i, bucket in enumerate(buckets) for r in bucket)
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


KEYS = st.one_of(st.none(), st.integers(), st.text(max_size=8), st.floats(allow_nan=False), st.booleans(),
                 st.tuples(st.integers(), st.text(max_size=4)))


@pytest.mark.parametrize("stable_hash", ["_fixed_seed_hash", "_crc_hash"])
@given(keys=st.lists(KEYS, max_size=50, unique=True))
def test_the_key_groups_of_many_keys_are_each_ones_key_group(stable_hash, keys):
    """key_groups masks the built-in hash without a call per key where it is stable (as
    in executors, negative hashes and None keys included) and is key_group elsewhere."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(partitioners, "stable_hash", getattr(partitioners, stable_hash))
        changed = dict.fromkeys(keys)
        assert list(key_groups(changed.keys())) == [key_group(key) for key in changed]


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
