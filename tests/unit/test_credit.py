"""The sender's side of credit: grants are running counts, so losing, repeating or
reordering them never stalls a sender for good nor lets it past the window."""

import asyncio

import pytest

from gearbus.api.partitioners import HashPartitioner
from gearbus.api.task import Record
from gearbus.runtime.frames import Frame
from gearbus.control.config import AppConfig
from gearbus.runtime.sender import Channel
from services.executor.outputs import Outputs

WINDOW = 4


def sent(channel: Channel, frames: int) -> None:
    """What Outputs does per frame: wait for the window, then take the next sequence number."""
    for _ in range(frames):
        assert channel.seq < channel.limit, "sent past the window"
        channel.seq += 1


def test_a_new_channel_may_send_one_window():
    channel = Channel((2, 0), WINDOW)
    sent(channel, WINDOW)
    assert channel.seq == channel.limit == WINDOW


def test_a_lost_grant_is_repaired_by_the_next_one():
    channel = Channel((2, 0), WINDOW)
    sent(channel, WINDOW)
    # the receiver's grant of 2 was lost; its next one says 4
    channel.grant(4, WINDOW)
    assert channel.limit == 8


def test_repeated_and_overtaken_grants_change_nothing():
    channel = Channel((2, 0), WINDOW)
    sent(channel, WINDOW)
    channel.grant(4, WINDOW)
    channel.grant(4, WINDOW)
    channel.grant(2, WINDOW)  # an older grant arriving late
    assert channel.limit == 8


def test_a_grant_counting_frames_never_sent_does_not_open_the_window_further():
    channel = Channel((2, 0), WINDOW)
    sent(channel, 2)
    channel.grant(1_000_000, WINDOW)
    assert channel.limit == 2 + WINDOW


@pytest.mark.timeout(5)
async def test_a_sender_waits_for_the_window_and_resumes_on_a_grant():
    delivered: list[Frame] = []
    outputs = Outputs(None, 1, 1, 0, 0, [(HashPartitioner(), 2, 1)], AppConfig(credit_frames=WINDOW))
    outputs.link_local({(2, 0): lambda frame, size: delivered.append(frame)})
    frames = [outgoing for n in range(WINDOW + 1)
              for outgoing in outputs.sender.send([Record(n, 0, None)], 0)]
    waiter = asyncio.create_task(outputs.publish(frames))
    await asyncio.sleep(0)
    assert not waiter.done()
    assert [f.seq for f in delivered] == list(range(1, WINDOW + 1))
    assert outputs.grant(2, 0, 0, 1, WINDOW)
    await asyncio.wait_for(waiter, 1)
    assert [f.seq for f in delivered] == list(range(1, WINDOW + 2))
