"""What delivery guarantee an application runs with, and which step decides it.

With aligned checkpoints and rollback recovery, results are exactly-once end to end when
every source replays from its checkpointed position and every sink commits in two
phases. A source that cannot replay (a live core-NATS feed, say) loses what it had read
since the checkpoint: at-most-once. A sink that writes at once writes the replayed
records again: at-least-once. Both together: no guarantee.
"""

from __future__ import annotations

from gearbus.api.graph import Application

EXACTLY_ONCE = "exactly-once"
AT_LEAST_ONCE = "at-least-once"
AT_MOST_ONCE = "at-most-once"
NONE = "none"


def _sinks(processor):
    """(step name, DataSink) of every sink a processor writes to, chained ones included."""
    if processor.data_sink is not None:
        yield processor.name, processor.data_sink
    for op in processor.config.get("ops", ()):
        sink = getattr(op, "data_sink", None)
        if sink is not None:
            yield op.step, sink
        late = getattr(op, "late", None)
        if late is not None:
            yield late.step, late.data_sink


def delivery_guarantee(app: Application, checkpoints: bool = True) -> tuple[str, str]:
    """(guarantee, the reason when it is weaker than exactly-once)."""
    sources = [p for p in app.graph.processors if p.data_source is not None]
    not_replayable = [f"source {p.name!r} ({type(p.data_source).__name__}) cannot replay"
                      for p in sources if not p.data_source.replayable]
    not_transactional = [f"sink {step!r} ({type(sink).__name__}) is not transactional"
                         for p in app.graph.processors for step, sink in _sinks(p) if not sink.transactional]
    if not checkpoints:
        not_transactional.insert(0, "checkpoints are off (checkpoint_interval_ms=0): a recovery starts over")
    if not_replayable and not_transactional:
        return NONE, "; ".join(not_replayable + not_transactional)
    if not_replayable:
        return AT_MOST_ONCE, "; ".join(not_replayable)
    if not_transactional:
        return AT_LEAST_ONCE, "; ".join(not_transactional)
    return EXACTLY_ONCE, ""
