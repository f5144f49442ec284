"""What security costs: the same work on an open cluster and on a secure one (a credential
per role, TLS with client certificates), side by side in one run.

    python bench/security.py [--lines 200000] [--repeat 3] [--rate 5000] [--seconds 6]

1. Throughput: two embedded clusters (nats-server, master, 2 workers each), one open and
   one from `gearbus security init --tls`, run the shuffle-heavy wordcount (``--combine-keys
   1``) on the same seeded file, alternating, ``--repeat`` times each; lines per second of
   the running phase (ACTIVE to SUCCEEDED), median per cluster, ratio secure / open. Every
   output is checked against a Counter.
2. Latency: bench/latency.py's two-hop pipeline (`gearbus run`, and `gearbus run --secure`)
   at ``--rate`` events/s for ``--seconds``; p50 / p99 / p99.9 and the ratios.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from common import count_problems, parser_from_doc  # noqa: E402  (bench/, beside this file)
from latency import run_gearbus  # noqa: E402
from metrics import generate, read_counts  # noqa: E402

from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from gearbus.security import init  # noqa: E402
from shared.messages import AppState  # noqa: E402

WORDCOUNT = os.path.join(REPO, "examples", "wordcount.py")


async def run_once(client: Client, text: str, output: str) -> float:
    app_id = await client.submit(pack(WORDCOUNT), ["--input", text, "--output", output, "--combine-keys", "1"])
    seen: dict[str, float] = {}
    final = await client.wait(app_id, timeout=600, seen=seen)
    if final.state != AppState.SUCCEEDED:
        raise SystemExit(f"wordcount ended {final.state}: {final.error}")
    return seen[AppState.SUCCEEDED] - seen[AppState.ACTIVE]


async def throughput(tmp: str, lines: int, repeat: int) -> None:
    text = os.path.join(tmp, "text.txt")
    expected = generate(text, lines)
    security = init(os.path.join(tmp, "security"), tls=True)
    rates: dict[str, list[float]] = {"open": [], "secure": []}
    with LocalCluster(log_dir=os.path.join(tmp, "logs-open")) as open_cluster, \
            LocalCluster(log_dir=os.path.join(tmp, "logs-secure"), security=security) as secure_cluster:
        async with Client(open_cluster.url, timeout=60) as open_client, \
                Client(secure_cluster.url, timeout=60, security=security.security("client")) as secure_client:
            clients = {"open": open_client, "secure": secure_client}
            for n in range(repeat):
                for kind in (("open", "secure") if n % 2 == 0 else ("secure", "open")):
                    output = os.path.join(tmp, f"out-{n}-{kind}.jsonl")
                    seconds = await run_once(clients[kind], text, output)
                    problems = count_problems(read_counts(output), expected, "words")
                    if problems:
                        raise SystemExit(f"wrong output on the {kind} cluster: " + "; ".join(problems))
                    rates[kind].append(lines / seconds)
                    print(f"  run {n + 1} {kind:6}  {lines / seconds:>10,.0f} lines/s")
    plain, secure = statistics.median(rates["open"]), statistics.median(rates["secure"])
    print(f"\nwordcount --combine-keys 1, {lines:,} lines, median of {repeat}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}:")
    print(f"  open cluster          {plain:>10,.0f} lines/s")
    print(f"  secure cluster (TLS)  {secure:>10,.0f} lines/s")
    print(f"  ratio secure / open   {secure / plain:10.3f}")


def latency(tmp: str, rate: float, seconds: float) -> None:
    count, warmup = int(rate * seconds), int(rate)
    plain = run_gearbus(rate, count, warmup, tmp)
    secure = run_gearbus(rate, count, warmup, tmp, secure=True)
    print(f"\nlatency, two hops, {rate:,.0f} events/s for {seconds:g} s (first second left out):")
    print(f"{'ms':<8}{'open':>10}{'secure (TLS)':>14}{'ratio':>8}")
    for name in ("p50", "p99", "p99.9"):
        print(f"{name:<8}{plain[name]:>10.3f}{secure[name]:>14.3f}{secure[name] / plain[name]:>8.2f}")


def main() -> None:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--rate", type=float, default=5_000)
    parser.add_argument("--seconds", type=float, default=6)
    opts = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gearbus-bench-security-") as tmp:
        asyncio.run(throughput(tmp, opts.lines, opts.repeat))
        latency(tmp, opts.rate, opts.seconds)


if __name__ == "__main__":
    main()
