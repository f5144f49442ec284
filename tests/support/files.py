"""Writing test inputs and reading outputs as the examples and test apps lay them out."""

from __future__ import annotations

import glob
import io
import json
import os
import zipfile


def write_text(path, lines) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines))


def write_jsonl(path, rows) -> str:
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
    return str(path)


def read_jsonl(path) -> list[dict]:
    """The rows of a JSON Lines file, or of a directory's part files (as Spark writes them)."""
    files = sorted(glob.glob(os.path.join(path, "part-*"))) if os.path.isdir(path) else [path]
    rows = []
    for name in files:
        with open(name, encoding="utf-8") as f:
            rows += [json.loads(line) for line in f if line.strip()]
    return rows


def canonical(rows: list[dict]) -> list[str]:
    """Rows as sorted JSON strings: outputs compared without regard to order."""
    return sorted(json.dumps(r, sort_keys=True) for r in rows)


def zipped(entries: dict[str, str]) -> bytes:
    """A zip archive of ``entries`` (name -> text), as bytes."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, text in entries.items():
            zf.writestr(name, text)
    return buffer.getvalue()
