"""What the dashboard's charts and timeline show of each app.

The story comes from the cluster, so a dashboard started at any time shows all of it: the
events the app's AppMaster recorded when they happened (rescales, replacements, restarts,
its state), its checkpoint history, when the master saw it submitted and finished, and
each processor's figures as the AppMaster sampled them over the last ``window_s``.

What this process adds is what the cluster does not keep: every checkpoint it saw (an
AppMaster reports only its last few) and, for an app whose AppMaster has gone, the figures
it sampled itself every ``sample_s`` while the app ran. Pure: no clock read, no I/O."""

from __future__ import annotations

import collections
from collections.abc import Iterable
from dataclasses import dataclass, field

from shared.messages import AppState, AppSummary, MetricsHistory, MetricsSample, ProcessorSample

DEFAULT_SAMPLE_S = 5.0
DEFAULT_WINDOW_S = 15 * 60.0
#: the figures charted per processor, as ProcessorSample names them
CHARTED = tuple(name for name in ProcessorSample.__dataclass_fields__ if name != "processor")


@dataclass
class _AppHistory:
    samples: collections.deque[MetricsSample] = field(default_factory=collections.deque)  # oldest first
    checkpoints: dict[int, dict] = field(default_factory=dict)  # checkpoint id -> its timeline event
    names: dict[int, str] = field(default_factory=dict)  # processor id -> name, as last seen


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
        oldest = now_ms - self.window_s * 1000
        for app in apps:
            history = self._apps.setdefault(app.app_id, _AppHistory())
            self._checkpoints(history, app)
            if app.state == AppState.ACTIVE and app.processors:
                history.names = {p.processor: p.name for p in app.processors}
                history.samples.append(MetricsSample(now_ms, [ProcessorSample.of(p) for p in app.processors]))
            while history.samples and history.samples[0].t_ms < oldest:
                history.samples.popleft()
            history.checkpoints = {i: e for i, e in history.checkpoints.items() if e["t_ms"] >= oldest}

    def series(self, app_id: int, kept: MetricsHistory | None = None) -> dict:
        """The charts' data: each processor's figures at each sample time, as the app's
        AppMaster ``kept`` them (None: its AppMaster has gone; as sampled here)."""
        if kept is not None:
            return _series(kept.interval_ms / 1000, kept.window_ms / 1000,
                           {p.id: p.name for p in kept.processors}, kept.samples)
        history = self._apps.get(app_id) or _AppHistory()
        return _series(self.sample_s, self.window_s, history.names, history.samples)

    def timeline(self, app: AppSummary, now_ms: int) -> list[dict]:
        """What happened to the app over the window, oldest first."""
        history = self._apps.get(app.app_id) or _AppHistory()
        self._checkpoints(history, app)
        events = [{"t_ms": e.t_ms, "kind": e.kind, "detail": e.detail} for e in app.events]
        events.append({"t_ms": app.submitted_ms, "kind": "state", "detail": f"{AppState.PENDING} (submitted)"})
        if app.finished_ms:
            why = f" ({app.error.error_type}: {app.error.message})" if app.error and app.state == AppState.FAILED else ""
            events.append({"t_ms": app.finished_ms, "kind": "state", "detail": app.state + why})
        oldest = now_ms - self.window_s * 1000
        return sorted((e for e in [*events, *history.checkpoints.values()] if e["t_ms"] >= oldest),
                      key=lambda e: e["t_ms"])

    @staticmethod
    def _checkpoints(history: _AppHistory, app: AppSummary) -> None:
        for record in app.checkpoints.history if app.checkpoints else ():
            if record.status != "in_progress":
                failure = f", {record.failure}" if record.failure else ""
                history.checkpoints[record.checkpoint_id] = {
                    "t_ms": record.trigger_ms, "kind": f"checkpoint_{record.status}",
                    "detail": f"checkpoint {record.checkpoint_id}: {record.duration_ms} ms, {record.size_bytes} bytes"
                              f"{failure}"}


def _series(sample_s: float, window_s: float, names: dict[int, str], samples: Iterable[MetricsSample]) -> dict:
    return {"sample_s": sample_s, "window_s": window_s,
            "processors": [{"processor": p, "name": name} for p, name in sorted(names.items())],
            "samples": [{"t_ms": s.t_ms, "processors": {str(p.processor): {name: getattr(p, name) for name in CHARTED}
                                                          for p in s.processors}} for s in samples]}
