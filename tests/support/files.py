"""Writing test inputs and reading outputs as the examples and test apps lay them out."""

from __future__ import annotations

import io
import json
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
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


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
