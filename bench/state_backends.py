"""The state backends' hot path, side by side in one run: what chose RocksDB for disk state.

    python bench/state_backends.py [--keys 2000000] [--records 4000000] [--batch 1024]

A keyed running count over ``--records`` records whose keys are drawn uniformly from
``--keys`` distinct ones, fed in batches of ``--batch``, each run in a process of its own
(with PYTHONHASHSEED=0, as executors run) so its memory is its own:

* ``memory``: the ``stateful_map`` operator itself (StatefulMapOp), its state in a dict
  (the default backend);
* ``rocksdb``: the same operator, its state in the rocksdb backend (written back between
  batches): what an app gets;
* ``memory window`` and ``rocksdb window``: a window step counting per key over sliding
  windows of 10 s every 2 s (the records' event time goes 1 ms per 100 records, and the
  watermark follows each batch), its panes in each backend;
* ``rocksdb loop`` and ``lmdb loop``: the two stores the issue named compared bare, with
  the same loop per batch (read the batch's keys, add, write them back in one write batch
  or transaction; pickled keys and values; no write-ahead log or sync), RocksDB through
  ``rocksdict`` with bloom filters and a 128 MiB block cache, LMDB when it is installed
  (``pip install lmdb``).

Printed per backend: records/s, its ratio to ``memory``'s (``memory window``'s for the
window step on disk), the process's peak resident
memory, its resident memory after the last batch (the state still held) split into heap
(anonymous) and file-backed pages (LMDB's memory map), and the bytes on disk. This is a
benchmark, not a test: it fails only when a run does.
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

BACKENDS = ("memory", "rocksdb", "memory window", "rocksdb window", "rocksdb loop", "lmdb loop")
#: Records per millisecond of event time.
PER_MS = 100
#: This process's heap and file-backed resident memory once the count finished.
HELD: dict[str, int] = {}


def batches(opts):
    rng = random.Random(7)
    for start in range(0, opts.records, opts.batch):
        yield [(1, (start + i) // PER_MS, f"key{rng.randrange(opts.keys)}")
               for i in range(min(opts.batch, opts.records - start))]


def timed(opts, count_batch, finish) -> float:
    """Seconds ``count_batch`` takes over every batch and ``finish`` after (making the
    batches is not timed)."""
    elapsed = 0.0
    for batch in batches(opts):
        started = time.perf_counter()
        count_batch(batch)
        elapsed += time.perf_counter() - started
    HELD.update(memory_split())  # while the state is still held (``finish`` may close the store)
    started = time.perf_counter()
    finish()
    return elapsed + time.perf_counter() - started


def count_with_op(opts, backend_name: str, directory: str) -> float:
    """StatefulMapOp counting, its state in ``backend_name``."""
    from gearbus.runtime.keyed import StatefulMapOp
    from gearbus.runtime.state_backend import open_backend

    class Task:
        state_backend = open_backend(backend_name, directory, "bench")

    op = StatefulMapOp("count", lambda state, value: ((state or 0) + value, None), None)
    op.open(Task())
    elapsed = timed(opts, op.process, getattr(op.states.values, "flush", lambda: None))
    assert 0 < len(op.states.values) <= opts.keys
    return elapsed


def count_in_windows(opts, backend_name: str, directory: str) -> float:
    """A window step counting per key over sliding windows, its panes in ``backend_name``."""
    from gearbus.api.aggregators import Count
    from gearbus.api.windows import SlidingWindows
    from gearbus.runtime.chain import WindowAggregateOp
    from gearbus.runtime.state_backend import open_backend
    from gearbus.runtime.windows import WindowOperator

    class Task:
        state_backend = open_backend(backend_name, directory, "bench")

    op = WindowAggregateOp("window", lambda: WindowOperator(SlidingWindows(10_000, 2_000), Count()), False)
    op.open(Task())

    def count_batch(batch):
        op.process(batch)
        op.on_watermark(batch[-1][1] - 1)

    return timed(opts, count_batch, Task.state_backend.close)


def count_with_lmdb(opts, directory: str) -> float:
    """The count on bare LMDB: a read and a write transaction per batch of records."""
    import lmdb

    env = lmdb.open(directory, map_size=1 << 40, sync=False, metasync=False, readahead=False)

    def count_batch(batch):
        encoded = [pickle.dumps(key) for _, _, key in batch]
        with env.begin() as txn:
            counts = {key: pickle.loads(raw) if (raw := txn.get(key)) is not None else 0 for key in encoded}
        for key, (value, _, _) in zip(encoded, batch):
            counts[key] += value
        with env.begin(write=True) as txn:
            for key, count in counts.items():
                txn.put(key, pickle.dumps(count))

    return timed(opts, count_batch, env.close)


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

    def count_batch(batch):
        encoded = [pickle.dumps(key) for _, _, key in batch]
        unique = list(dict.fromkeys(encoded))
        counts = {key: pickle.loads(raw) if raw is not None else 0 for key, raw in zip(unique, db.get(unique))}
        for key, (value, _, _) in zip(encoded, batch):
            counts[key] += value
        write = rocksdict.WriteBatch(raw_mode=True)
        for key, count in counts.items():
            write.put(key, pickle.dumps(count))
        db.write(write)

    return timed(opts, count_batch, db.close)


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
    directory = tempfile.mkdtemp(prefix=f"gearbus-bench-{backend.replace(' ', '-')}-")
    try:
        if backend == "rocksdb loop":
            elapsed = count_with_rocksdb(opts, directory)
        elif backend == "lmdb loop":
            elapsed = count_with_lmdb(opts, directory)
        elif backend.endswith(" window"):
            elapsed = count_in_windows(opts, backend.split()[0], directory)
        else:
            elapsed = count_with_op(opts, backend, directory)
        disk = sum(os.stat(os.path.join(root, name)).st_blocks * 512
                   for root, _, names in os.walk(directory) for name in names)
        return {"backend": backend, "records_per_s": opts.records / elapsed, "disk_bytes": disk,
                "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **HELD}
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
        if backend == "lmdb loop":
            try:
                import lmdb  # noqa: F401
            except ImportError:
                print("lmdb loop: skipped (pip install lmdb to compare)")
                continue
        ran = subprocess.run([sys.executable, __file__, "--one", backend, "--keys", str(opts.keys),
                              "--records", str(opts.records), "--batch", str(opts.batch)],
                             check=True, capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": "0"})
        results[backend] = json.loads(ran.stdout.strip().splitlines()[-1])
    print(f"{opts.records:,} records over {opts.keys:,} keys, batches of {opts.batch}")
    print(f"{'backend':<14}{'records/s':>12}{'/ memory':>10}{'peak RSS MB':>13}{'heap MB':>9}{'file MB':>9}"
          f"{'disk MB':>9}")
    for name, r in results.items():
        base = results["memory window" if name.endswith(" window") else "memory"]["records_per_s"]
        print(f"{name:<14}{r['records_per_s']:>12,.0f}{r['records_per_s'] / base:>10.2f}{r['peak_rss'] / 2**20:>13.0f}"
              f"{r.get('RssAnon', 0) / 2**20:>9.0f}{r.get('RssFile', 0) / 2**20:>9.0f}{r['disk_bytes'] / 2**20:>9.0f}")


if __name__ == "__main__":
    main()
