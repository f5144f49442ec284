"""What the role processes of a test's cluster logged (JSON lines in its log directory)."""

from __future__ import annotations

import json
import os


def logged(log_dir: str, event: str) -> list[dict]:
    """Every line logged with this event, by any process, as its fields."""
    found, marker = [], f'"event": "{event}"'
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name), errors="replace") as log:
            found += [json.loads(line) for line in log if marker in line]
    return found
