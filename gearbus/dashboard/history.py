"""What the dashboard remembers of each app: its processors' figures, sampled from the
app summaries every ``sample_s`` over the last ``window_s`` (the charts), and a timeline of
what happened to it (its state changes, restarts, rescales, replacements of its code and
checkpoints) over the same window.

Kept in this process's memory and nowhere else, so it needs no service of its own: a
dashboard started later, or restarted, charts from then on (every dashboard samples for
itself; the figures each shows are the masters'). Pure: :meth:`History.observe` takes
the summaries and the time, and nothing here reads a clock or does I/O."""

from __future__ import annotations

import collections
from dataclasses import dataclass, field

from shared.messages import AppState, AppSummary

DEFAULT_SAMPLE_S = 5.0
DEFAULT_WINDOW_S = 15 * 60.0
#: the figures charted per processor, as ProcessorMetrics names them
CHARTED = ("records_in_per_s", "backpressure", "watermark_lag_ms", "state_bytes")


@dataclass
class _AppHistory:
    samples: collections.deque  # (t_ms, {processor id: {figure: value}}), oldest first
    events: collections.deque  # {"t_ms", "kind", "detail"}, oldest first
    names: dict[int, str] = field(default_factory=dict)  # processor id -> name, as last seen
    state: str = ""
    restarts: int = 0
    last_checkpoint: int = 0  # the newest checkpoint on the timeline (only the newest is ever in progress)
    parallelism: dict[int, int] = field(default_factory=dict)  # processor id -> its parallelism, as last seen
    versions: dict[int, str] = field(default_factory=dict)  # code version -> its state, as last seen


class History:
    def __init__(self, sample_s: float = DEFAULT_SAMPLE_S, window_s: float = DEFAULT_WINDOW_S):
        if sample_s <= 0 or window_s < sample_s:
            raise ValueError("the sample interval must be positive and the window at least one interval")
        self.sample_s = sample_s
        self.window_s = window_s
        self._apps: dict[int, _AppHistory] = {}

    def observe(self, apps: list[AppSummary], now_ms: int) -> None:
        """One sample of every app listed; apps no longer listed are forgotten, and what
        is older than the window goes."""
        listed = {a.app_id for a in apps}
        self._apps = {app_id: h for app_id, h in self._apps.items() if app_id in listed}
        for app in apps:
            history = self._apps.get(app.app_id)
            if history is None:
                history = self._apps[app.app_id] = _AppHistory(collections.deque(), collections.deque())
            self._observe(history, app, now_ms)
            self._trim(history, now_ms)

    def series(self, app_id: int) -> dict:
        """The charts' data: each processor's figures at each sample time."""
        history = self._apps.get(app_id)
        samples = list(history.samples) if history else []
        return {"sample_s": self.sample_s, "window_s": self.window_s,
                "processors": [{"processor": p, "name": name} for p, name in sorted(history.names.items())]
                if history else [],
                "samples": [{"t_ms": t, "processors": {str(p): figures for p, figures in by_processor.items()}}
                            for t, by_processor in samples]}

    def timeline(self, app_id: int) -> list[dict]:
        """What happened to the app over the window, oldest first."""
        history = self._apps.get(app_id)
        return list(history.events) if history else []

    def _observe(self, history: _AppHistory, app: AppSummary, now_ms: int) -> None:
        if history.state and app.state != history.state:  # (when the first state seen began is not known)
            why = f" ({app.error.error_type}: {app.error.message})" if app.error and app.state == AppState.FAILED else ""
            history.events.append({"t_ms": now_ms, "kind": "state", "detail": app.state + why})
        history.state = app.state
        if app.restarts > history.restarts:
            epoch = app.checkpoints.epoch if app.checkpoints else None
            history.events.append({"t_ms": now_ms, "kind": "restart",
                                   "detail": f"restart {app.restarts}" + (f", epoch {epoch}" if epoch else "")})
        history.restarts = max(history.restarts, app.restarts)
        for record in app.checkpoints.history if app.checkpoints else ():
            if record.status == "in_progress" or record.checkpoint_id <= history.last_checkpoint:
                continue
            history.last_checkpoint = record.checkpoint_id
            history.events.append({"t_ms": record.trigger_ms, "kind": f"checkpoint_{record.status}",
                                   "detail": f"checkpoint {record.checkpoint_id}: {record.duration_ms} ms, "
                                             f"{record.size_bytes} bytes" + (f", {record.failure}"
                                                                             if record.failure else "")})
        parallelism = {p.processor: p.parallelism for p in app.processors}
        changed = [f"{p.name} {history.parallelism[p.processor]} → {p.parallelism}" for p in app.processors
                   if history.parallelism.get(p.processor, p.parallelism) != p.parallelism]
        if changed:
            history.events.append({"t_ms": now_ms, "kind": "rescale", "detail": ", ".join(changed)})
        history.parallelism = parallelism or history.parallelism
        for version in app.versions[1:]:  # the first is the app as submitted
            if history.versions.get(version.version) != version.state:
                history.versions[version.version] = version.state
                error = f": {version.error}" if version.error else ""
                history.events.append({"t_ms": now_ms, "kind": "replace", "detail": (
                    f"version {version.version} of processor {version.processor} (step {version.step}) "
                    f"{version.state}{error}")})
        if app.state == AppState.ACTIVE and app.processors:
            history.names = {p.processor: p.name for p in app.processors}
            history.samples.append((now_ms, {p.processor: {name: getattr(p, name) for name in CHARTED}
                                             for p in app.processors}))

    def _trim(self, history: _AppHistory, now_ms: int) -> None:
        oldest = now_ms - self.window_s * 1000
        while history.samples and history.samples[0][0] < oldest:
            history.samples.popleft()
        events = sorted(history.events, key=lambda e: e["t_ms"])  # a checkpoint comes in at its trigger time
        history.events = collections.deque(e for e in events if e["t_ms"] >= oldest)
