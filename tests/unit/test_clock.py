"""The application clock and stalled-task detection, without a network."""

from gearbus import WATERMARK_MAX, WATERMARK_MIN
from services.appmaster.clock import ClockService


def test_the_clock_is_the_minimum_watermark_of_unfinished_tasks():
    clock = ClockService(["a[0]", "b[0]"], stall_after_s=10, now=0)
    assert clock.clock() == WATERMARK_MIN
    clock.update("a[0]", 100, 0, False, now=1)
    clock.update("b[0]", 50, 0, False, now=1)
    assert clock.clock() == 50
    clock.update("b[0]", WATERMARK_MAX, 0, True, now=2)
    assert clock.clock() == 100
    clock.update("a[0]", WATERMARK_MAX, 0, True, now=3)
    assert clock.clock() == WATERMARK_MAX


def test_a_task_is_stalled_when_its_watermark_stands_still_while_records_arrive():
    clock = ClockService(["a[0]", "b[0]"], stall_after_s=10, now=0)
    clock.update("a[0]", 5, 100, False, now=1)
    clock.update("b[0]", 5, 100, False, now=1)
    clock.update("a[0]", 5, 180, False, now=5)  # records keep coming, event time does not move
    assert clock.stalled(now=10) == []
    assert clock.stalled(now=11) == ["a[0]"]  # b received nothing more: idle, not stalled
    clock.update("a[0]", 6, 200, False, now=12)
    assert clock.stalled(now=30) == []
    clock.update("a[0]", 6, 300, True, now=30)
    assert clock.stalled(now=40) == []
