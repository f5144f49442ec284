"""map_async throughput: records/s of one task calling a NATS service that answers in
10 ms, with 100 calls in flight, beside the same pipeline with one call in flight.

    python bench/async_map.py [--records 20000] [--baseline-records 300] [--concurrency 100]
        [--service-ms 10] [--repeat 1]

Runs examples/enrich.py (read_jsonl -> map_async(request) -> write_jsonl) with one task on
an embedded cluster (a nats-server, a master, one worker). The service is a process of
its own that answers each request --service-ms after it arrived; the time it actually
took (its timer is late by a fraction of a millisecond) is printed too. records/s per
task = requests / (the service's last request - its first), so start-up and the final
checkpoint are left out; the output is checked (every order once, with its customer).
Beside them, the same requests from this process without gearbus, as many in flight:
through the example's NatsRequester (the ratio: what gearbus costs), and through nats-py's
own ``nc.request``. Goal: >= 8,000 records/s per task at 100 in flight.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
import subprocess
import sys
import threading
import time

import nats
import uvloop

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from common import BenchError, in_temp_dir, parser_from_doc  # noqa: E402  (bench/, beside this file)
from gearbus import NatsRequester  # noqa: E402
from gearbus.artifact import pack  # noqa: E402
from gearbus.client import Client  # noqa: E402
from gearbus.cluster import LocalCluster  # noqa: E402
from gearbus.natsserver import NatsServer  # noqa: E402
from shared.messages import AppState  # noqa: E402

APP = os.path.join(REPO, "examples", "enrich.py")
SUBJECT = "bench.customers"
STATS = "bench.customers.stats"  # the service's count and times of the requests since the last ask
CUSTOMERS = 1000
GOAL = 8000


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def serve(url: str, delay_s: float) -> None:
    """The service: answers a customer id with ``{"id": id}`` ``delay_s`` after the request
    came. It speaks the NATS protocol itself (MSG in, PUB out) and answers every request
    then due at once, so it costs the machine a few microseconds a request: the task, the
    nats-server and the service share 2 cores here, and a service on a machine of its own
    would cost the task nothing. The answers are timed by a thread of their own, as an
    event loop's timers fire up to a millisecond late. It stamps each arrival and answer,
    and reports them on the stats subject."""
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    await reader.readuntil(b"\r\n")  # INFO
    writer.write(b'CONNECT {"verbose":false,"pedantic":false,"name":"bench-service"}\r\n'
                 b"SUB %s 1\r\nSUB %s 2\r\n" % (SUBJECT.encode(), STATS.encode()))
    loop = asyncio.get_running_loop()
    due: collections.deque[tuple[float, bytes, bytes]] = collections.deque()  # appended here, taken by the thread
    came = threading.Event()
    arrivals: list[float] = []
    holds: list[float] = []  # seconds from each request's arrival to its answer

    def publish(reply: bytes, data: bytes) -> bytes:
        return b"PUB %s %d\r\n%s\r\n" % (reply, len(data), data)

    def answer() -> None:
        while True:
            if not due:
                came.wait()
                came.clear()
                continue
            wait = due[0][0] + delay_s - time.monotonic()
            if wait > 0:
                time.sleep(wait)
                continue
            now, answers = time.monotonic(), []
            while due and due[0][0] + delay_s <= now:
                arrived, reply, data = due.popleft()
                holds.append(now - arrived)
                answers.append(publish(reply, b'{"id": ' + data + b"}"))
            loop.call_soon_threadsafe(writer.writelines, answers)

    def stats() -> bytes:
        taken, held = arrivals[:], holds[:]
        del arrivals[:len(taken)], holds[:len(held)]
        return json.dumps([len(taken), taken[0] if taken else 0, taken[-1] if taken else 0,
                           statistics.median(held) * 1000 if held else 0]).encode()

    sys.setswitchinterval(0.0002)  # the timing thread gets the interpreter soon when it wakes
    threading.Thread(target=answer, name="answers", daemon=True).start()
    writer.write(b"PING\r\n")
    print("ready" if await reader.readuntil(b"\r\n") == b"PONG\r\n" else "refused", flush=True)
    while True:
        line = await reader.readuntil(b"\r\n")
        if line.startswith(b"MSG "):
            _, _, sid, reply, size = line.split()
            data = (await reader.readexactly(int(size) + 2))[:-2]
            if sid == b"1":
                arrivals.append(time.monotonic())
                due.append((arrivals[-1], reply, data))
                came.set()
            else:
                writer.write(publish(reply, stats()))
        elif line.startswith(b"PING"):
            writer.write(b"PONG\r\n")
        elif line.startswith(b"-ERR"):
            raise BenchError(f"the service's nats-server said {line.decode().strip()}")


async def service_rate(nc, records: int) -> tuple[float, float]:
    """Requests per second between the service's first and last since the last ask, and
    the median ms from a request's arrival to its answer."""
    count, first, last, hold_ms = json.loads((await nc.request(STATS, b"", timeout=10)).data)
    if count < records:
        raise BenchError(f"the service saw {count} requests for {records} records")
    return (count - 1) / (last - first), hold_ms


def orders(n: int) -> list[dict]:
    return [{"id": i, "customer": i % CUSTOMERS} for i in range(n)]


def check(path: str, expected: list[dict]) -> None:
    with open(path) as f:
        rows = [json.loads(line) for line in f]
    if sorted((r["id"], r["customer"]["id"]) for r in rows) != sorted((o["id"], o["customer"]) for o in expected):
        raise BenchError(f"{path}: {len(rows)} rows for {len(expected)} orders, or wrong customers")


async def run_pipeline(client: Client, url: str, tmp: str, records: int, concurrency: int,
                       timeout: float) -> tuple[float, float]:
    """One run of the pipeline with ``concurrency`` calls in flight; its records/s and the
    service's median answer time."""
    data, out = os.path.join(tmp, f"orders-{records}.jsonl"), os.path.join(tmp, f"out-{concurrency}.jsonl")
    expected = orders(records)
    with open(data, "w") as f:
        f.writelines(json.dumps(o) + "\n" for o in expected)
    args = ["--input", data, "--output", out, "--nats", url, "--service", SUBJECT,
            "--concurrency", str(concurrency), "--parallelism", "1"]
    app_id = await client.submit(pack(APP), args)
    final = await client.wait(app_id, timeout=timeout)
    if final.state != AppState.SUCCEEDED:
        raise BenchError(f"app {app_id} ended {final.state}: {final.error}")
    check(out, expected)
    rate, hold_ms = await service_rate(client.bus.nc, records)
    log(f"pipeline, {concurrency} in flight: {records:,} records, {rate:,.0f} records/s per task; output checked; "
        f"the service answered {hold_ms:.2f} ms after a request came (median)")
    return rate, hold_ms


async def run_bare(url: str, records: int, concurrency: int, requester: bool) -> tuple[float, float]:
    """The same requests from this process without gearbus, ``concurrency`` callers each
    asking for the next order: through the example's NatsRequester, or nats-py's
    ``nc.request``."""
    nc = await nats.connect(url, name="bench-bare-client")
    ask = NatsRequester(url, SUBJECT).request if requester else None
    pending = iter(orders(records))

    async def caller() -> None:
        for order in pending:
            payload = str(order["customer"]).encode()
            await (ask(payload) if ask else nc.request(SUBJECT, payload, timeout=30))

    try:
        await asyncio.gather(*(caller() for _ in range(concurrency)))
        rate, hold_ms = await service_rate(nc, records)
    finally:
        await nc.close()
    log(f"bare {'NatsRequester' if requester else 'nc.request'}, {concurrency} in flight: {records:,} requests, "
        f"{rate:,.0f} requests/s; the service answered {hold_ms:.2f} ms after a request came (median)")
    return rate, hold_ms


async def bench(opts, tmp: str) -> int:
    load = os.getloadavg()[0]
    server = NatsServer(store_dir=os.path.join(tmp, "jetstream"), log_path=os.path.join(tmp, "nats-server.log"))
    os.makedirs(server.store_dir)
    server.start()
    service = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", server.url,
                                "--service-ms", str(opts.service_ms)], stdout=subprocess.PIPE, text=True)
    cluster = LocalCluster(workers=1, slots=4, log_dir=os.path.join(tmp, "logs"), nats=server)
    runs: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)  # (records/s, answer ms)
    try:
        if service.stdout.readline().strip() != "ready":
            raise BenchError("the service did not start")
        cluster.start()
        async with Client(server.url, timeout=30) as client:
            deadline = time.monotonic() + 60
            while not any(w.alive for w in (await client.info()).workers):
                if time.monotonic() > deadline:
                    raise BenchError("no worker registered within 60 s")
                await asyncio.sleep(0.2)
            for _ in range(opts.repeat):
                runs["async"].append(await run_pipeline(client, server.url, tmp, opts.records, opts.concurrency,
                                                        opts.timeout))
                runs["baseline"].append(await run_pipeline(client, server.url, tmp, opts.baseline_records, 1,
                                                           opts.timeout))
                runs["bare"].append(await run_bare(server.url, opts.records, opts.concurrency, requester=True))
                runs["nats-py"].append(await run_bare(server.url, opts.records, opts.concurrency, requester=False))
    finally:
        cluster.stop()
        service.kill()
        service.wait()
        server.stop()
    ours, base, bare, nats_py = (statistics.median(rate for rate, _ in runs[k])
                                 for k in ("async", "baseline", "bare", "nats-py"))
    hold = statistics.median(hold for _, hold in runs["async"])
    print(f"map_async: one task calling a service that answers in {opts.service_ms:g} ms over NATS; medians of "
          f"{opts.repeat}; {os.cpu_count()} CPUs, load {load:.2f} before, {os.getloadavg()[0]:.2f} after")
    rows = [(f"map_async, {opts.concurrency} in flight", f"{ours:,.0f} records/s per task"),
            ("map_async, 1 in flight (baseline)", f"{base:,.0f} records/s per task"),
            ("ratio", f"{ours / base:.1f}"),
            (f"bare NatsRequester, {opts.concurrency} in flight", f"{bare:,.0f} requests/s"),
            ("map_async / bare", f"{ours / bare:.2f}"),
            (f"bare nats-py nc.request, {opts.concurrency} in flight", f"{nats_py:,.0f} requests/s"),
            (f"the service's answer, {opts.concurrency} in flight", f"{hold:.2f} ms after the request (median)")]
    width = max(len(label) for label, _ in rows)
    for label, value in rows:
        print(f"{label:<{width}}  {value:>26}")
    print(f"goal >= {GOAL:,} records/s per task at {opts.concurrency} in flight: "
          f"{'meets' if ours >= GOAL else 'MISSES'}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = parser_from_doc(__doc__)
    parser.add_argument("--records", type=int, default=20_000, help="orders with many calls in flight")
    parser.add_argument("--baseline-records", type=int, default=300, help="orders with one call in flight")
    parser.add_argument("--concurrency", type=int, default=100, help="calls in flight")
    parser.add_argument("--service-ms", type=float, default=10.0, help="the service's answer time")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per app run")
    parser.add_argument("--keep", action="store_true", help="keep the temp directory (logs, data)")
    parser.add_argument("--serve", metavar="URL", help=argparse.SUPPRESS)  # run as the service
    opts = parser.parse_args(argv)
    if opts.serve:
        uvloop.run(serve(opts.serve, opts.service_ms / 1000))  # as fast a loop as the executors'
        return 0
    if min(opts.records, opts.baseline_records) < 2 or min(opts.concurrency, opts.repeat) < 1:
        parser.error("--records and --baseline-records must be at least 2, --concurrency and --repeat at least 1")
    return in_temp_dir("gearbus-async-map-", opts.keep, lambda tmp: asyncio.run(bench(opts, tmp)))


if __name__ == "__main__":
    sys.exit(main())
