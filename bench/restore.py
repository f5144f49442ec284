"""A keyed step's restore, by backend, side by side in one run: what a recovery, a rescale's
new task and a replacement wait for before they take records.

    python bench/restore.py [--keys 1000000] [--changes 8] [--changed 60000] [--trials 3]

A ``stateful_map`` step (StatefulMapOp) holding ``--keys`` int keys (as bench/state_app.py's)
takes a whole snapshot, then ``--changes`` snapshots of ``--changed`` keys each written
again, each through pickle as it is stored. The chain is restored into a fresh step with
the memory backend (the baseline) and with rocksdb, as a task restores it: whole alone,
the chain added up, and the chain as a rescale's new task reads it (its share of one old
task's snapshots, all of them owned). Printed: the median seconds of ``--trials``, the
microseconds per key, and each backend's ratio to memory's. This is a benchmark, not a
test: it fails only when a run does.
"""

from __future__ import annotations

import os
import pickle
import random
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from gearbus.runtime.keygroups import chain_onto, keyed_share  # noqa: E402
from gearbus.runtime.keyed import StatefulMapOp  # noqa: E402
from gearbus.runtime.state_backend import open_backend  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import parser_from_doc  # noqa: E402  (bench/, beside this file)


class _Task:
    """What a step's open() reads of its task: the backend its state lives in."""

    context = None

    def __init__(self, backend):
        self.state_backend = backend


def _step(backend) -> StatefulMapOp:
    op = StatefulMapOp("count", lambda count, value: (value, None), None)
    op.open(_Task(backend))
    return op


def chain(keys: int, changes: int, changed: int) -> tuple[bytes, list[bytes]]:
    """(the whole snapshot, the changes on it), as stored: each trial reads them back anew
    (what a restore works out of them is not kept from one to the next)."""
    source, draw = _step(open_backend("memory", None, "bench")), random.Random(7)
    source.process([(n, 0, n * 7919) for n in range(keys)])
    source.prepare_checkpoint(1)
    whole, deltas = _stored(source.snapshot_since(None)), []
    for checkpoint in range(2, 2 + changes):
        source.process([(checkpoint, 0, draw.randrange(keys) * 7919) for _ in range(changed)])
        source.prepare_checkpoint(checkpoint)
        deltas.append(_stored(source.snapshot_since(checkpoint - 1)))
    return whole, deltas


def _stored(state) -> bytes:
    return pickle.dumps(state, pickle.HIGHEST_PROTOCOL)


def _added_up(whole: bytes, deltas: list[bytes]) -> dict:
    """The chain read back and added up, as a restore gets it."""
    state = pickle.loads(whole)
    return chain_onto(state, [pickle.loads(delta) for delta in deltas]) if deltas else state


def restore_s(backend_name: str, state) -> float:
    """Seconds to restore ``state`` into a fresh step (RocksDB's writes all out)."""
    with tempfile.TemporaryDirectory() as root:
        backend = open_backend(backend_name, root, "bench")
        try:
            op = _step(backend)
            started = time.perf_counter()
            op.restore(state)
            getattr(op.states.values, "flush", lambda: None)()
            return time.perf_counter() - started
        finally:
            backend.close()


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=8)
    parser.add_argument("--changed", type=int, default=60_000, help="keys each change writes again")
    parser.add_argument("--trials", type=int, default=3)
    opts = parser.parse_args(argv)
    if opts.keys < 1 or opts.changes < 0 or opts.changed < 0 or opts.trials < 1:
        parser.error("--keys and --trials must be positive, --changes and --changed not negative")
    whole, deltas = chain(opts.keys, opts.changes, opts.changed)
    cases = {"whole": lambda: _added_up(whole, []),
             f"chain of {opts.changes}": lambda: _added_up(whole, deltas),
             "rescale's share": lambda: keyed_share([_added_up(whole, deltas)], 0, 1)}
    print(f"restore of a stateful_map step holding {opts.keys:,} keys (changes: {opts.changes} of "
          f"{opts.changed:,} keys), median of {opts.trials}")
    print(f"{'':18}{'memory s':>10}{'us/key':>8}{'rocksdb s':>11}{'us/key':>8}{'rocksdb / memory':>18}")
    for name, state in cases.items():
        medians = {backend: statistics.median(restore_s(backend, state()) for _ in range(opts.trials))
                   for backend in ("memory", "rocksdb")}
        memory, rocksdb = medians["memory"], medians["rocksdb"]
        print(f"{name:18}{memory:>10.2f}{memory / opts.keys * 1e6:>8.2f}{rocksdb:>11.2f}"
              f"{rocksdb / opts.keys * 1e6:>8.2f}{rocksdb / memory:>18.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
