"""How fast the Nexmark generator makes events on one core: per kind through a generator
source's read() (as a source task calls it), and whole events as --dump-events makes them.

    python bench/nexmark_generator.py [--events 2000000] [--batch 4096]
"""

from __future__ import annotations

import argparse
import time
from types import SimpleNamespace

from gearbus.api.task import TaskContext
from gearbus.nexmark import AUCTION, BID, EVENT, PERSON, GeneratorSource


def events_per_second(kind: str, events: int, batch: int) -> tuple[int, float]:
    source = GeneratorSource(kind, events=events)
    source.open(TaskContext(0, "bench", SimpleNamespace(id=0, name="bench", parallelism=1, config={}), 0, 0))
    made, started = 0, time.perf_counter()
    while (records := source.read(batch)) is not None:
        made += len(records)
    return made, made / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=2_000_000, help="event numbers to go through per kind")
    parser.add_argument("--batch", type=int, default=4096, help="records per read (the runtime's batch_records)")
    opts = parser.parse_args()
    for kind in (BID, AUCTION, PERSON, EVENT):
        made, rate = events_per_second(kind, opts.events, opts.batch)
        print(f"{kind:8} {made:>10,} records  {rate:>12,.0f} records/s")


if __name__ == "__main__":
    main()
