"""A bounded test app whose keyed state cannot be checkpointed, with no checkpoint failure
tolerated. ``lock``: each key holds a lock, which cannot even be copied (the snapshot
fails the step); ``function``: each key holds a local function, copied fine but refused by
pickle (the checkpoint is declined).

    unpicklable_state.py OUTPUT.jsonl lock|function
"""

import threading

from gearbus import Pipeline


def application(args):
    output, held = args
    make = threading.Lock if held == "lock" else lambda: (lambda: None)
    p = Pipeline("unpicklable", config={"checkpoint_failures_tolerated": 0})
    (p.from_collection(range(20), name="numbers")
      .group_by(lambda n: n % 2, name="by_parity")
      .stateful_map(lambda state, n: (state or make(), n), name="hold")
      .write_jsonl(output, name="write"))
    return p
