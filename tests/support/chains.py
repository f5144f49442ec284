"""Chains of incremental snapshots, as a test stores them: what one adds up to."""

from __future__ import annotations

from gearbus.runtime.keygroups import Delta, chain_onto
from gearbus.runtime.snapshots import Lineage, TaskSnapshot


def added_up(stored: dict[int, TaskSnapshot], checkpoint_id: int):
    """The whole state the chain of ``checkpoint_id``'s snapshot adds up to: its root,
    then each later snapshot's changes onto it (and :func:`chain_onto` says the same)."""
    chain, at = [], checkpoint_id
    while at is not None:
        chain.insert(0, stored[at].state)
        at = stored[at].base[0] if stored[at].base else None
    state = None
    for part in chain:
        state = part.onto(state) if isinstance(part, Delta) else part
    whole = max((n for n, part in enumerate(chain) if not isinstance(part, Delta)), default=None)
    deltas = chain[whole + 1:] if whole is not None else chain
    if deltas:  # the chain added up at once, as a restore and a compaction do, agrees
        assert chain_onto(chain[whole] if whole is not None else None, deltas) == state
    return state


def snapshot_into(stored: dict[int, TaskSnapshot], lineage: Lineage, step, watermark: int) -> int:
    """Take ``step``'s snapshot for the next checkpoint as its task does (building on what
    ``lineage`` plans), store it in ``stored``, and return the checkpoint's id."""
    checkpoint_id = len(stored) + 1
    step.prepare_checkpoint(checkpoint_id)
    link, base = lineage.plan(checkpoint_id, 0)
    state = step.snapshot_since(base.checkpoint_id if base else None)
    assert base is not None or not isinstance(state, Delta), "a snapshot with no base must be whole"
    stored[checkpoint_id] = TaskSnapshot(checkpoint_id, state, False, watermark, 0,
                                         (base.checkpoint_id, 0) if base else None, link.depth, link.root)
    return checkpoint_id
