"""Feeds examples/clicks.py: click events published to a JetStream stream at a steady rate.

    python examples/click_producer.py [--nats URL] [--stream CLICKS] [--rate 50] [--count N]
        [--users 20] [--seed 1]

Makes the stream (subjects ``clicks.>``) when it does not exist, then publishes
``{"user": "u7", "page": "/cart", "ts": epoch_ms}`` to ``clicks.<region>`` (eu, us, ap),
``--rate`` a second, until ``--count`` events (default: until interrupted). The events
are drawn from ``--seed``, so a run can be checked. NATS comes from ``--nats``, else
``GEARBUS_NATS_URL``, else nats://127.0.0.1:4222. Prints how many it published.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time

import nats
from nats.js.api import StreamConfig
from nats.js.errors import NotFoundError

REGIONS = ("eu", "us", "ap")
PAGES = ("/home", "/search", "/item", "/cart", "/checkout")


def clicks(users: int, seed: int):
    """Endless (subject, event) pairs, the same for the same seed."""
    rng = random.Random(seed)
    while True:
        event = {"user": f"u{rng.randrange(users)}", "page": rng.choice(PAGES)}
        yield f"clicks.{rng.choice(REGIONS)}", event


async def produce(url: str, stream: str, rate: float, count: int | None, users: int, seed: int) -> int:
    """Publish, say how many on the way out (an interrupt included), and return the count."""
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=0)
    sent = 0
    try:
        js = nc.jetstream()
        try:
            await js.stream_info(stream)
        except NotFoundError:
            await js.add_stream(StreamConfig(name=stream, subjects=["clicks.>"]))
        started = time.monotonic()
        for subject, event in clicks(users, seed):
            if count is not None and sent >= count:
                break
            event["ts"] = int(time.time() * 1000)
            await js.publish(subject, json.dumps(event).encode(), stream=stream)
            sent += 1
            ahead = started + sent / rate - time.monotonic()  # a steady rate, not a burst per second
            if ahead > 0:
                await asyncio.sleep(ahead)
        return sent
    finally:
        print(f"published {sent} clicks to stream {stream}", flush=True)
        await nc.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nats", default=os.environ.get("GEARBUS_NATS_URL", "nats://127.0.0.1:4222"))
    parser.add_argument("--stream", default="CLICKS", help="the JetStream stream (default %(default)s)")
    parser.add_argument("--rate", type=float, default=50, help="events a second (default %(default)s)")
    parser.add_argument("--count", type=int, default=None, help="stop after this many (default: never)")
    parser.add_argument("--users", type=int, default=20, help="distinct users (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1, help="what to draw the events from (default %(default)s)")
    opts = parser.parse_args(argv)
    if opts.rate <= 0 or opts.users < 1 or (opts.count is not None and opts.count < 0):
        parser.error("--rate and --users must be positive, --count not negative")
    try:
        asyncio.run(produce(opts.nats, opts.stream, opts.rate, opts.count, opts.users, opts.seed))
    except KeyboardInterrupt:
        pass
    except (OSError, nats.errors.Error) as exc:
        print(f"click_producer: cannot publish to {opts.nats}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
