"""How fast a user error fails the app: a pipeline whose input file is missing, from submit to FAILED, beside the same pipeline succeeding on a small input, on one cluster, in one run.

The missing input is a user error: the app restores once, meets the same error again and
fails naming the step, the path and the worker, with no worker blacklisted (both checked on
every trial). The baseline is the same app reading a file of ``--lines`` lines to the end:
what a submission costs when nothing goes wrong. The trials alternate between the two.

    python bench/fail_fast.py [--trials 5] [--lines 1000]
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from common import BenchError, parser_from_doc  # noqa: E402  (bench/, beside this file)

from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from shared.messages import AppState, FailureKind  # noqa: E402

APP = '''
from gearbus import Pipeline

def application(args):
    p = Pipeline("fail-fast", parallelism=2)
    p.read_jsonl(args[0], name="events").map(lambda e: e, name="same").write_jsonl(args[1], name="write")
    return p
'''


async def submit_and_wait(client: Client, artifact, args: list[str], name: str) -> tuple[float, object]:
    started = time.perf_counter()
    app_id = await client.submit(artifact, args, name=name)
    final = await client.wait(app_id, timeout=120)
    return time.perf_counter() - started, final


async def trials(url: str, scratch: str, count: int, lines: int) -> dict[str, list[float]]:
    app = os.path.join(scratch, "fail_fast_app.py")
    with open(app, "w") as f:
        f.write(APP)
    present = os.path.join(scratch, "present.jsonl")
    with open(present, "w") as f:
        f.writelines(json.dumps({"n": n}) + "\n" for n in range(lines))
    artifact = pack(app)
    times: dict[str, list[float]] = {"missing input -> FAILED": [], "input present -> SUCCEEDED": []}
    async with Client(url, timeout=30) as client:
        for trial in range(count):
            took, final = await submit_and_wait(client, artifact, [os.path.join(scratch, f"absent{trial}.jsonl"),
                                                                   os.path.join(scratch, f"out-a{trial}.jsonl")],
                                                f"missing{trial}")
            error = final.error
            if final.state != AppState.FAILED or error is None or error.kind != FailureKind.USER \
                    or error.step != "events" or final.restarts != 1 or final.blacklisted_workers:
                raise BenchError(f"the missing input did not fail as a user error on its second occurrence: {final}")
            times["missing input -> FAILED"].append(took)
            took, final = await submit_and_wait(client, artifact, [present, os.path.join(scratch, f"out-p{trial}.jsonl")],
                                                f"present{trial}")
            if final.state != AppState.SUCCEEDED:
                raise BenchError(f"the baseline did not succeed: {final.error}")
            times["input present -> SUCCEEDED"].append(took)
            print(f"trial {trial + 1}/{count}: {times['missing input -> FAILED'][-1]:.3f} s failed, "
                  f"{took:.3f} s succeeded", file=sys.stderr, flush=True)
    return times


def main() -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--trials", type=int, default=5, help="submissions of each kind")
    parser.add_argument("--lines", type=int, default=1000, help="lines of the baseline's input")
    opts = parser.parse_args()
    if opts.trials < 1 or opts.lines < 0:
        parser.error("--trials must be at least 1 and --lines not negative")
    with tempfile.TemporaryDirectory(prefix="gearbus-fail-fast-") as scratch:
        with LocalCluster(workers=2, slots=4, log_dir=scratch) as cluster:
            try:
                times = asyncio.run(trials(cluster.url, scratch, opts.trials, opts.lines))
            except BenchError as exc:
                print(f"fail_fast: {exc}", file=sys.stderr)
                return 1
    baseline = statistics.median(times["input present -> SUCCEEDED"])
    print(f"fail-fast: {opts.trials} trials each, 2 workers, load {os.getloadavg()[0]:.2f}; submit to the end, seconds")
    print(f"{'':28}  {'median':>7}  {'min':>7}  {'max':>7}  {'ratio':>6}")
    for label, samples in times.items():
        print(f"{label:28}  {statistics.median(samples):7.3f}  {min(samples):7.3f}  {max(samples):7.3f}  "
              f"{statistics.median(samples) / baseline:6.2f}")
    print("every missing input failed as a user error on its second occurrence (restarts 1), step 'events', "
          "no worker blacklisted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
