"""Publishes ``count`` sensor readings into the READINGS stream with ids from their timestamps,
so running it again stores nothing twice. Arguments: NATS url, count."""

from gearbus import Pipeline


def reading(n):
    return {"sensor": f"s{n % 4}", "temp": n % 30, "ts": 1_700_000_000_000 + n * 250}


def application(args):
    url, count = args
    p = Pipeline("to-jetstream", parallelism=2)
    (p.from_collection(range(int(count)), parallelism=2)
      .map(reading, name="reading")
      .write_jetstream("readings.raw", stream="READINGS", id_fn=lambda r: r["ts"], name="publish", servers=url))
    return p
