"""The pause of a live code replacement (gearbus replace) beside the way every peer changes
a running app's code: stop with a savepoint, submit the new code from it.

    python bench/replace.py [--keys 1000000] [--backend memory] [--trials 2]

bench/state_app.py's keyed running count (group_by -> stateful_map over KEYS distinct keys,
fed as fast as the source goes, its counting step in 2 tasks) runs on an embedded cluster
until it holds every key. Then, ``--trials`` times, the counting step's code is replaced by
a new version (bench/state_app.py again: what is measured is the handover, not the code):

* live: ``Client.replace`` (what ``gearbus replace`` sends). The pause is from the request
  until the counting step takes records in the new epoch (seen in the app's status, polled
  every 50 ms); the request's own time (it returns once the new code passed its trial, a
  checkpoint covering records it processed) is printed beside it.
* resubmit: ``savepoint --stop``, then the app submitted again from that savepoint. The
  pause is from the savepoint request until the new app's counting step takes records.

Printed: each pause, the medians, and resubmit / live. A live replacement, as a rescale,
parks every task at its checkpoint: the processors not replaced pause too, and go on in
place once the new code's tasks run.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import embedded_cluster, in_temp_dir, parser_from_doc  # noqa: E402  (bench/, beside this file)
from rescale import APP, add_options, flowing, holding_every_key, resubmit_once, submit  # noqa: E402

from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402


async def live(client: Client, opts) -> list[tuple[float, float]]:
    """(pause, the request's time) of each live replacement."""
    app_id = await submit(client, opts, 2)
    await holding_every_key(client, app_id, opts)
    found = []
    for trial in range(opts.trials):
        await asyncio.sleep(opts.settle)
        epoch = (await client.status(app_id)).checkpoints.epoch
        started = time.monotonic()
        replacing = asyncio.create_task(client.replace(app_id, "count", pack(APP),
                                                       ["--keys", str(opts.keys), "--counters", "2"]))
        await flowing(client, app_id, 2, epoch, opts.timeout)
        pause = time.monotonic() - started
        await replacing
        found.append((pause, time.monotonic() - started))
        print(f"live {trial + 1}: flowing after {pause:.2f} s (answered after {found[-1][1]:.2f} s)",
              file=sys.stderr, flush=True)
    await client.kill(app_id)
    return found


async def resubmitted(client: Client, opts) -> list[float]:
    """The pause of each stop-with-savepoint and resubmit."""
    app_id = await submit(client, opts, 2)
    await holding_every_key(client, app_id, opts)
    found = []
    for trial in range(opts.trials):
        await asyncio.sleep(opts.settle)
        app_id, pause = await resubmit_once(client, opts, app_id, 2, f"replace-{trial}")
        found.append(pause)
        print(f"resubmit {trial + 1}: flowing after {pause:.2f} s", file=sys.stderr, flush=True)
    await client.kill(app_id)
    return found


async def bench(opts, tmp: str) -> int:
    with embedded_cluster(tmp) as (server, _):
        async with Client(server.url, timeout=60) as client:
            replaced = await live(client, opts)
            restarted = await resubmitted(client, opts)
    live_p50 = statistics.median(pause for pause, _ in replaced)
    answered = statistics.median(answer for _, answer in replaced)
    resubmit_p50 = statistics.median(restarted)
    print(f"replacing the counting step's code of a keyed running count over {opts.keys:,} keys ({opts.backend} "
          f"backend, checkpoints every {opts.interval_ms} ms), {opts.trials} trials; seconds from the request "
          "until records flow in the new code")
    print(f"{'live p50':>10}{'(answered)':>12}{'resubmit p50':>14}{'resubmit / live':>17}")
    print(f"{live_p50:>10.2f}{answered:>12.2f}{resubmit_p50:>14.2f}{resubmit_p50 / live_p50:>17.2f}")
    print("each live: " + ", ".join(f"{pause:.2f}" for pause, _ in replaced))
    print("each resubmit: " + ", ".join(f"{pause:.2f}" for pause in restarted))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    add_options(parser)
    opts = parser.parse_args(argv)
    if opts.keys < 1 or opts.trials < 1 or opts.settle < 0:
        parser.error("--keys and --trials must be positive, --settle >= 0")
    return in_temp_dir("gearbus-replace-", opts.keep, lambda tmp: asyncio.run(bench(opts, tmp)))


if __name__ == "__main__":
    sys.exit(main())
