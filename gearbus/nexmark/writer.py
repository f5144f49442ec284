"""Generated events into an events file, without a pipeline (for tests, the oracle and
benchmarks that need the input on disk first)."""

from __future__ import annotations

import json
import os

from gearbus.nexmark.generator import Generator, GeneratorConfig

WRITE_CHUNK_EVENTS = 50_000


def write_events(path: str | os.PathLike, events: int, config: GeneratorConfig = GeneratorConfig()) -> str:
    """Write events 0 .. ``events`` - 1 to ``path`` as JSON Lines; returns the path."""
    generator = Generator(config)
    with open(path, "w", encoding="utf-8") as f:
        for start in range(0, events, WRITE_CHUNK_EVENTS):
            f.writelines(json.dumps(event, ensure_ascii=False) + "\n"
                         for event in generator.events(start, min(start + WRITE_CHUNK_EVENTS, events)))
    return os.fspath(path)
