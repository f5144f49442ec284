"""The pause of a live rescale (gearbus rescale) beside the way every peer rescales: stop
with a savepoint, submit again at the new parallelism.

    python bench/rescale.py [--keys 1000000] [--backend memory] [--to 4] [--trials 2]

bench/state_app.py's keyed running count (group_by -> stateful_map over KEYS distinct
keys, fed as fast as the source goes, its counting step in 2 tasks) runs on an embedded
cluster until it holds every key. Then, ``--trials`` times, its counting step goes from 2
tasks to ``--to`` and back to 2:

* live: ``Client.rescale`` (what ``gearbus rescale`` sends). The pause is from the request
  until the counting step's tasks at the new parallelism take records again (seen in the
  app's status, polled every 50 ms); the request's own time (it returns once the tasks run)
  is printed beside it.
* resubmit: ``savepoint --stop``, then the same app submitted from that savepoint with the
  counting step at the new parallelism (Flink's and the Python peers' way). The pause is from
  the savepoint request until the new app's counting step takes records.

Printed per direction: each pause, its median, the counting step's state (its estimated
bytes: what was divided) per second of the live pause, resubmit / live, and the records the
processors not rescaled (the source, the sink) processed from the request until the counting
step flows, as their tasks' counters went up (the status before the request lags by up to a
heartbeat). Those tasks park at the rescale's checkpoint and go on in place once the new
tasks run, so they take little more than what their credit allows meanwhile.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import BenchError, embedded_cluster, in_temp_dir, parser_from_doc  # noqa: E402  (bench/, beside this file)

from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from shared.messages import AppState  # noqa: E402

APP = os.path.join(os.path.dirname(os.path.abspath(__file__)), "state_app.py")
POLL_S = 0.05


def counting(status):
    """The processor holding the counts (the one with keyed state)."""
    return next((p for p in status.processors if p.name.startswith("count")), None)


def taken_by_others(status) -> int:
    """The records the tasks of the processors other than the counting one took so far."""
    step = counting(status)
    return sum(t.records_in for t in status.tasks if t.task.processor != step.processor)


async def submit(client: Client, opts, counters: int, config: dict | None = None) -> int:
    return await client.submit(pack(APP), ["--keys", str(opts.keys), "--counters", str(counters)],
                               config={"checkpoint_interval_ms": opts.interval_ms, "state_backend": opts.backend,
                                       **(config or {})})


async def flowing(client: Client, app_id: int, parallelism: int, after_epoch: int, timeout: float):
    """The status once the counting step runs ``parallelism`` tasks in an epoch after
    ``after_epoch`` and takes records (its tasks' counters are of that epoch)."""
    deadline = time.monotonic() + timeout
    while True:
        status = await client.status(app_id)
        step = counting(status)
        epoch = status.checkpoints.epoch if status.checkpoints else 0
        tasks = [t for t in status.tasks if step is not None and t.task.processor == step.processor]
        if status.state == AppState.ACTIVE and step is not None and epoch > after_epoch \
                and len(tasks) == parallelism and all(t.epoch == epoch for t in tasks) \
                and sum(t.records_in for t in tasks) > 0:
            return status
        if status.state in AppState.TERMINAL or time.monotonic() > deadline:
            raise BenchError(f"app {app_id} is {status.state} (epoch {epoch}), not flowing at {parallelism}: "
                             f"{status.error}")
        await asyncio.sleep(POLL_S)


async def holding_every_key(client: Client, app_id: int, opts):
    deadline = time.monotonic() + opts.timeout
    while (step := counting(status := await client.status(app_id))) is None or step.state_keys < opts.keys:
        if status.state in AppState.TERMINAL or time.monotonic() > deadline:
            raise BenchError(f"app {app_id} is {status.state}, holding {step.state_keys if step else 0:,} keys")
        await asyncio.sleep(0.2)
    return status


async def live(client: Client, opts) -> dict[int, list[tuple[float, float, int, int]]]:
    """(pause, the request's time, state bytes, records the other processors took meanwhile)
    of each live rescale, by its new parallelism."""
    app_id = await submit(client, opts, 2)
    status = await holding_every_key(client, app_id, opts)
    found: dict[int, list[tuple[float, float, int, int]]] = {opts.to: [], 2: []}
    for trial in range(opts.trials):
        for parallelism in (opts.to, 2):
            await asyncio.sleep(opts.settle)
            status = await client.status(app_id)
            epoch, state = status.checkpoints.epoch, counting(status).state_bytes
            others_before = taken_by_others(status)
            started = time.monotonic()
            await client.rescale(app_id, {"count": parallelism})
            answered = time.monotonic() - started
            status = await flowing(client, app_id, parallelism, epoch, opts.timeout)
            others = taken_by_others(status) - others_before
            found[parallelism].append((time.monotonic() - started, answered, state, others))
            print(f"live {trial + 1}: to {parallelism}: flowing after {found[parallelism][-1][0]:.2f} s (answered "
                  f"after {answered:.2f} s), {state:,} bytes of state, {others:,} records taken by the others "
                  "meanwhile", file=sys.stderr, flush=True)
    await client.kill(app_id)
    return found


async def resubmitted(client: Client, opts) -> dict[int, list[float]]:
    """The pause of each stop-with-savepoint and resubmit, by the new parallelism."""
    app_id = await submit(client, opts, 2)
    await holding_every_key(client, app_id, opts)
    found: dict[int, list[float]] = {opts.to: [], 2: []}
    for trial in range(opts.trials):
        for parallelism in (opts.to, 2):
            await asyncio.sleep(opts.settle)
            app_id, pause = await resubmit_once(client, opts, app_id, parallelism, f"rescale-{trial}-{parallelism}")
            found[parallelism].append(pause)
            print(f"resubmit {trial + 1}: to {parallelism}: flowing after {pause:.2f} s", file=sys.stderr, flush=True)
    await client.kill(app_id)
    return found


async def resubmit_once(client: Client, opts, app_id: int, parallelism: int, savepoint: str) -> tuple[int, float]:
    """Stop ``app_id`` with a savepoint and submit it again from it, its counting step at
    ``parallelism``: the new app's id, and the seconds until its counting step takes records."""
    started = time.monotonic()
    taken = await client.savepoint(app_id, savepoint, stop=True)
    await client.wait(app_id, timeout=opts.timeout)
    app_id = await submit(client, opts, parallelism, {"from_savepoint": taken.name})
    await flowing(client, app_id, parallelism, -1, opts.timeout)
    return app_id, time.monotonic() - started


def add_options(parser) -> None:
    """The options bench/rescale.py and bench/replace.py share: the app and the trials."""
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    parser.add_argument("--trials", type=int, default=2, help="changes, live and resubmitted")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds of running before each change")
    parser.add_argument("--interval-ms", type=int, default=1000, help="checkpoint interval")
    parser.add_argument("--backend", choices=("memory", "rocksdb"), default="memory")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for each step")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (logs, store)")


async def bench(opts, tmp: str) -> int:
    with embedded_cluster(tmp) as (server, _):
        async with Client(server.url, timeout=60) as client:
            rescaled = await live(client, opts)
            restarted = await resubmitted(client, opts)
    print(f"rescale of a keyed running count over {opts.keys:,} keys ({opts.backend} backend, checkpoints every "
          f"{opts.interval_ms} ms), counting step 2 -> {opts.to} -> 2, {opts.trials} trials; seconds from the "
          "request until records flow at the new parallelism")
    print(f"{'':14}{'live p50':>10}{'(answered)':>12}{'resubmit p50':>14}{'resubmit / live':>17}"
          f"{'state MB/s live':>17}{'others took':>13}")
    for parallelism in (opts.to, 2):
        pauses = [pause for pause, *_ in rescaled[parallelism]]
        live_p50, resubmit_p50 = statistics.median(pauses), statistics.median(restarted[parallelism])
        answered = statistics.median(a for _, a, *_ in rescaled[parallelism])
        moved = statistics.median(state / pause for pause, _, state, _ in rescaled[parallelism]) / 1e6
        others = statistics.median(took for *_, took in rescaled[parallelism])
        print(f"{f'to {parallelism} tasks':14}{live_p50:>10.2f}{answered:>12.2f}{resubmit_p50:>14.2f}"
              f"{resubmit_p50 / live_p50:>17.2f}{moved:>17.1f}{others:>13,.0f}")
    print("each live: " + "; ".join(f"to {p}: " + ", ".join(f"{pause:.2f}" for pause, *_ in rescaled[p])
                                      for p in (opts.to, 2)))
    print("each resubmit: " + "; ".join(f"to {p}: " + ", ".join(f"{pause:.2f}" for pause in restarted[p])
                                          for p in (opts.to, 2)))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    add_options(parser)
    parser.add_argument("--to", type=int, default=4, help="the counting step's tasks after the first rescale")
    opts = parser.parse_args(argv)
    if opts.keys < 1 or not 1 <= opts.to <= 128 or opts.to == 2 or opts.trials < 1 or opts.settle < 0:
        parser.error("--keys and --trials must be positive, --to between 1 and 128 and not 2, --settle >= 0")
    return in_temp_dir("gearbus-rescale-", opts.keep, lambda tmp: asyncio.run(bench(opts, tmp)))


if __name__ == "__main__":
    sys.exit(main())
