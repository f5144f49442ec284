"""What an AppMaster keeps of its app's recent life, so a dashboard started at any time
shows the whole story: the app's events (rescales, replacements, restarts) at the times
they happened, and each processor's charted figures over the last 15 minutes.

Bounded and cheap: the last EVENTS_KEPT events; samples at the heartbeat's rate, spaced
further for an app with many processors so no more than SAMPLES_KEPT processor samples are
kept (about 100 bytes each on the wire: a reply stays well under NATS's 1 MB message size).
Free of I/O: times are given."""

from __future__ import annotations

import collections
import math

from shared.messages import AppEvent, MetricsHistory, MetricsSample, ProcessorInfo, ProcessorMetrics, ProcessorSample

WINDOW_MS = 15 * 60 * 1000
EVENTS_KEPT = 100
SAMPLES_KEPT = 3_600  # 15 minutes of 4 processors at 1 s


class AppTimeline:
    def __init__(self, window_ms: int = WINDOW_MS, events_kept: int = EVENTS_KEPT, samples_kept: int = SAMPLES_KEPT):
        self.window_ms = window_ms
        self.samples_kept = samples_kept
        self.events: collections.deque[AppEvent] = collections.deque(maxlen=events_kept)
        self.samples: collections.deque[MetricsSample] = collections.deque()
        self.recorded = 0  # events recorded by this AppMaster: the store is written when it grows

    def event(self, t_ms: int, kind: str, detail: str) -> None:
        self.events.append(AppEvent(t_ms, kind, detail))
        self.recorded += 1

    def restore(self, events: list[AppEvent]) -> None:
        """A relaunched AppMaster's: the events its predecessors recorded (and stored)."""
        self.events = collections.deque([*events, *self.events], maxlen=self.events.maxlen)

    def spacing_ms(self, processors: int) -> int:
        """How close samples may be kept for an app of that many processors."""
        return math.ceil(self.window_ms * max(processors, 1) / self.samples_kept)

    def sample(self, t_ms: int, processors: list[ProcessorMetrics]) -> None:
        """The figures of a heartbeat, kept unless the last kept is too recent; what is
        older than the window goes."""
        if not processors or (self.samples and t_ms - self.samples[-1].t_ms < self.spacing_ms(len(processors))):
            return
        self.samples.append(MetricsSample(t_ms, [ProcessorSample.of(p) for p in processors]))
        while self.samples[0].t_ms < t_ms - self.window_ms:
            self.samples.popleft()

    def history(self, app_id: int, processors: list[ProcessorInfo], heartbeat_ms: int) -> MetricsHistory:
        return MetricsHistory(app_id, max(heartbeat_ms, self.spacing_ms(len(processors))), self.window_ms,
                              list(processors), list(self.samples))
