"""tests/apps/keyed_counts.py's output and what its tasks logged: each number written with
its key's count so far."""

from __future__ import annotations

import json
import os

from tests.support.logs import logged
from tests.support.paths import APPS

APP = os.path.join(APPS, "keyed_counts.py")


def assert_counted_once(output, keys: int) -> int:
    """Every number committed was counted once: the numbers run 0 to the last without a
    gap, and each key's counts run 1, 2, 3, ... in number order. The numbers committed."""
    rows = sorted((row["n"], row["count"]) for row in map(json.loads, output.read_text().splitlines()))
    assert [n for n, _ in rows] == list(range(len(rows))), "a number is missing or written twice"
    by_key: dict[int, list[int]] = {}
    for n, count in rows:
        by_key.setdefault(n % keys, []).append(count)
    wrong = {key: counts for key, counts in by_key.items() if counts != list(range(1, len(counts) + 1))}
    assert not wrong, f"keys whose counts skip or repeat: {sorted(wrong)[:5]}"
    return len(rows)


def groups_from_local_copies(log_dir: str) -> list[dict[str, int]]:
    """Per restore the executors logged, the key groups each step took from local copies."""
    return [fields["groups_from_local_copies"] for fields in logged(log_dir, "task_restored")
            if fields.get("groups_from_local_copies")]
