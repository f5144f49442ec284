"""A test app that never ends: numbers counted per key (n % KEYS) with stateful_map, each
written with its key's count so far, so its keyed state holds KEYS keys for as long as it
runs; with PARALLELISM (default 1) the counting runs in that many tasks, one executor
each; STATE_BACKEND names the app's state backend (default: the cluster's).

    keyed_counts.py KEYS OUTPUT.jsonl [PARALLELISM [STATE_BACKEND]]
"""

from gearbus import Pipeline
from gearbus.connectors.generator import RateSource


def application(args):
    keys, output = int(args[0]), args[1]
    parallelism = int(args[2]) if len(args) > 2 else 1
    backend = {"state_backend": args[3]} if len(args) > 3 else {}
    p = Pipeline("keyed_counts", config={"executors": parallelism, **backend}, parallelism=parallelism)
    (p.source(RateSource(rate=500), name="numbers", parallelism=1)
      .group_by(lambda n: n % keys, name="by_key")
      .stateful_map(lambda count, n: ((count or 0) + 1, {"n": n, "count": (count or 0) + 1}), name="count")
      .write_jsonl(output, name="write"))
    return p
