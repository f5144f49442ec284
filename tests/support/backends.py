"""A task as an operator's ``open`` sees it, its state held in a chosen state backend."""

from __future__ import annotations

import contextlib
from types import SimpleNamespace

from gearbus.runtime.state_backend import RocksDBBackend, open_backend


def task_holding_state_in(backend: str, backends: contextlib.ExitStack, flush_entries: int = 2,
                          context=None) -> SimpleNamespace:
    """A task whose ``state_backend`` is ``backend`` (closed, its files removed, with
    ``backends``); on disk its tables write out past ``flush_entries`` entries (few, so
    that tests read back what they wrote)."""
    opened = open_backend(backend, None, "test")
    if isinstance(opened, RocksDBBackend):
        opened.flush_entries = flush_entries
    backends.callback(opened.close)
    return SimpleNamespace(state_backend=opened, context=context)
