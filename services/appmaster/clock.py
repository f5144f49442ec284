"""The AppMaster's ClockService: the application clock and stalled tasks.

Pure bookkeeping fed by executor heartbeats: the application clock is the minimum
watermark over the tasks that have not finished; a task is stalled when its watermark
has not moved for ``stall_after_s`` although records keep arriving (an idle or stuck
input holding event time back while data piles up in window state).
"""

from __future__ import annotations

from dataclasses import dataclass

from gearbus.api.watermarks import WATERMARK_MAX, WATERMARK_MIN


@dataclass
class _TaskClock:
    watermark: int = WATERMARK_MIN
    records_in: int = 0
    records_at_move: int = 0  # records_in when the watermark last moved
    finished: bool = False
    since: float = 0.0  # when the watermark last moved


class ClockService:
    def __init__(self, tasks: list[str], stall_after_s: float, now: float):
        self.stall_after_s = stall_after_s
        self._tasks = {name: _TaskClock(since=now) for name in tasks}

    def update(self, task: str, watermark: int, records_in: int, finished: bool, now: float) -> None:
        clock = self._tasks.get(task)
        if clock is None:
            return
        if watermark != clock.watermark:
            clock.watermark, clock.since, clock.records_at_move = watermark, now, records_in
        clock.records_in, clock.finished = records_in, finished

    def clock(self) -> int:
        """The application clock: how far event time has got everywhere."""
        running = [c.watermark for c in self._tasks.values() if not c.finished]
        return min(running) if running else WATERMARK_MAX

    def stalled(self, now: float) -> list[str]:
        return sorted(
            name for name, c in self._tasks.items()
            if not c.finished and c.records_in > c.records_at_move and now - c.since >= self.stall_after_s
        )
