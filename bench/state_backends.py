"""The state backends' hot path, side by side in one run: what chose LMDB for disk state.

    python bench/state_backends.py [--keys 2000000] [--records 4000000] [--batch 1024]

A keyed running count (the ``stateful_map`` operator itself, StatefulMapOp) over
``--records`` records whose keys are drawn uniformly from ``--keys`` distinct ones, fed in
batches of ``--batch`` as an executor feeds it, once per backend, each in a process of its
own so its memory is its own:

* ``memory``: the step's state in a dict (the default backend);
* ``lmdb``: the step's state in LMDB, written back between batches (the disk backend);
* ``rocksdb``: the same read-modify-write loop on RocksDB through ``rocksdict`` (a
  multi-get per batch, a write batch per batch, WAL off), when rocksdict is installed
  (``pip install rocksdict``): the alternative the issue named.

Printed per backend: records/s, its ratio to ``memory``'s, the process's peak resident
memory, split at the end into heap (anonymous) and file-backed pages (LMDB's map), and
the bytes on disk. This is a benchmark, not a test: it fails only when a run does.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import random
import resource
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from common import parser_from_doc  # noqa: E402  (bench/, beside this file)

BACKENDS = ("memory", "lmdb", "rocksdb")


def batches(opts):
    rng = random.Random(7)
    for start in range(0, opts.records, opts.batch):
        yield [(1, 0, f"key{rng.randrange(opts.keys)}") for _ in range(min(opts.batch, opts.records - start))]


def count_with_op(opts, backend_name: str, directory: str) -> float:
    """Seconds StatefulMapOp takes over every batch, its state in ``backend_name``."""
    from gearbus.runtime.keyed import StatefulMapOp
    from gearbus.runtime.state_backend import open_backend

    class Task:
        state_backend = open_backend(backend_name, directory, "bench")

    op = StatefulMapOp("count", lambda state, value: ((state or 0) + value, None), None)
    op.open(Task())
    started = time.perf_counter()
    for batch in batches(opts):
        op.process(batch)
    getattr(op.states.values, "flush", lambda: None)()  # what still waits in memory counts too
    elapsed = time.perf_counter() - started
    assert len(op.states.values) == len({key for batch in batches(opts) for _, _, key in batch})
    return elapsed


def count_with_rocksdb(opts, directory: str) -> float:
    """The same count on RocksDB: a multi-get and a write batch per batch of records."""
    import rocksdict

    options = rocksdict.Options(raw_mode=True)
    options.create_if_missing(True)
    table = rocksdict.BlockBasedOptions()
    table.set_bloom_filter(10, False)
    table.set_block_cache(rocksdict.Cache(128 << 20))
    options.set_block_based_table_factory(table)
    db = rocksdict.Rdict(directory, options)
    writes = rocksdict.WriteOptions()
    writes.disable_wal = True
    db.set_write_options(writes)
    started = time.perf_counter()
    for batch in batches(opts):
        encoded = [pickle.dumps(key) for _, _, key in batch]
        unique = list(dict.fromkeys(encoded))
        counts = {key: pickle.loads(raw) if raw is not None else 0 for key, raw in zip(unique, db.get(unique))}
        for key, (value, _, _) in zip(encoded, batch):
            counts[key] += value
        write = rocksdict.WriteBatch(raw_mode=True)
        for key, count in counts.items():
            write.put(key, pickle.dumps(count))
        db.write(write)
    elapsed = time.perf_counter() - started
    db.close()
    return elapsed


def memory_split() -> dict[str, int]:
    """This process's resident memory now, heap and file-backed, in bytes (Linux)."""
    found = {}
    with open("/proc/self/status") as status:
        for line in status:
            name, _, value = line.partition(":")
            if name in ("RssAnon", "RssFile"):
                found[name] = int(value.split()[0]) * 1024
    return found


def one(opts, backend: str) -> dict:
    directory = tempfile.mkdtemp(prefix=f"gearbus-bench-{backend}-")
    try:
        if backend == "rocksdb":
            elapsed = count_with_rocksdb(opts, directory)
        else:
            elapsed = count_with_op(opts, backend, directory)
        disk = sum(os.stat(os.path.join(root, name)).st_blocks * 512
                   for root, _, names in os.walk(directory) for name in names)
        return {"backend": backend, "records_per_s": opts.records / elapsed, "disk_bytes": disk,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **memory_split()}
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--keys", type=int, default=2_000_000, help="distinct keys")
    parser.add_argument("--records", type=int, default=4_000_000, help="records counted")
    parser.add_argument("--batch", type=int, default=1024, help="records per batch")
    parser.add_argument("--one", choices=BACKENDS, help=argparse.SUPPRESS)
    opts = parser.parse_args()
    if opts.one:
        print(json.dumps(one(opts, opts.one)))
        return
    results = {}
    for backend in BACKENDS:
        if backend == "rocksdb":
            try:
                import rocksdict  # noqa: F401
            except ImportError:
                print("rocksdb: skipped (pip install rocksdict to compare)")
                continue
        ran = subprocess.run([sys.executable, __file__, "--one", backend, "--keys", str(opts.keys),
                              "--records", str(opts.records), "--batch", str(opts.batch)],
                             check=True, capture_output=True, text=True)
        results[backend] = json.loads(ran.stdout.strip().splitlines()[-1])
    base = results["memory"]["records_per_s"]
    print(f"{opts.records:,} records over {opts.keys:,} keys, batches of {opts.batch}")
    print(f"{'backend':<9}{'records/s':>12}{'/ memory':>10}{'peak RSS MB':>13}{'heap MB':>9}{'file MB':>9}{'disk MB':>9}")
    for name, r in results.items():
        print(f"{name:<9}{r['records_per_s']:>12,.0f}{r['records_per_s'] / base:>10.2f}{r['peak_rss'] / 2**20:>13.0f}"
              f"{r.get('RssAnon', 0) / 2**20:>9.0f}{r.get('RssFile', 0) / 2**20:>9.0f}{r['disk_bytes'] / 2**20:>9.0f}")


if __name__ == "__main__":
    main()
