"""A task's snapshot envelope: what one task stores for a checkpoint and restores from.

Written by the executor (to the JetStream object store) and the TestRunner (in memory),
read back by both on recovery, and made by the AppMaster when a savepoint seeds an
app's first checkpoint. Encoded as a versioned pickled tuple: the task's state is the
user's objects, whatever pickle can carry.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any

from gearbus.api.watermarks import WATERMARK_MIN

FORMAT = 1


@dataclass(frozen=True)
class TaskSnapshot:
    """``state``: what ``Task.snapshot()`` returned (None: nothing to restore, a savepoint
    held no state for the task); ``ended``: taken after the task's end; ``watermark``:
    the task's watermark at the barrier."""

    checkpoint_id: int
    state: Any
    ended: bool
    watermark: int

    @classmethod
    def seeded(cls, checkpoint_id: int, state: Any) -> TaskSnapshot:
        """A fresh task's envelope carrying ``state`` (from a savepoint)."""
        return cls(checkpoint_id, state, False, WATERMARK_MIN)

    def encode(self) -> bytes:
        """Bytes to store; raises whatever pickle raises when the state cannot be serialised."""
        return pickle.dumps((FORMAT, self.checkpoint_id, self.state, self.ended, self.watermark),
                            pickle.HIGHEST_PROTOCOL)

    @classmethod
    def decode(cls, data: bytes) -> TaskSnapshot:
        """The inverse of :meth:`encode`; ValueError for bytes of another format."""
        loaded = pickle.loads(data)
        if type(loaded) is not tuple or len(loaded) != 5 or loaded[0] != FORMAT:
            raise ValueError(f"not a task snapshot of format {FORMAT}")
        _, checkpoint_id, state, ended, watermark = loaded
        return cls(checkpoint_id, state, ended, watermark)
