"""Data-plane frames: encoding, fragmentation and reassembly."""

import pytest

from gearbus import Record
from gearbus.runtime.frames import WHOLE, DataPlaneError, FrameReader, MalformedFrame, encode_frame, split_message
from shared import values


def test_whole_frame_round_trip():
    data = encode_frame(1, 2, 99, 5, 1000, False, 0, [Record("x", 7, "k"), Record({"a": [1]}, 8)])
    sender, frame = FrameReader().feed(data)
    assert sender == (1, 2)
    assert frame.seq == 5 and frame.watermark == 1000 and not frame.eos
    assert frame.records == [Record("x", 7, "k"), Record({"a": [1]}, 8, None)]


def test_fragments_of_interleaved_senders_reassemble():
    big_a = encode_frame(0, 0, 1, 1, 0, False, 0, [Record("a" * 5000, 1)])
    big_b = encode_frame(0, 1, 1, 1, 0, True, 0, [Record("b" * 7000, 2)])
    parts_a, parts_b = split_message(big_a, 0, 0, 1, 1000), split_message(big_b, 0, 1, 1, 1000)
    assert len(parts_a) > 1 and all(len(p) <= 1000 for p in parts_a + parts_b)
    reader, frames = FrameReader(), []
    for pa, pb in zip(parts_a + [None] * 10, parts_b):
        for part in (pa, pb):
            if part is not None:
                _, frame = reader.feed(part)
                if frame is not None:
                    frames.append(frame)
    assert sorted(f.records[0].value for f in frames) == ["a" * 5000, "b" * 7000]


@pytest.mark.parametrize("data", [b"", b"\x09junk", b"\x00\xc1"])
def test_malformed_data_is_a_data_plane_error(data):
    with pytest.raises(DataPlaneError):
        FrameReader().feed(data)


def test_tuples_and_registered_named_tuples_keep_their_type_across_the_wire():
    from typing import NamedTuple

    from shared.values import register_tuple_type

    class Point(NamedTuple):
        x: int
        y: int

    register_tuple_type(99, Point)
    value = {"pair": ("a", 1), "point": Point(1, 2), "nested": [("x", (1, 2))]}
    _, frame = FrameReader().feed(encode_frame(0, 0, 1, 1, 0, False, 0, [Record(value, 1, ("k", 2))]))
    [record] = frame.records
    assert record == Record(value, 1, ("k", 2))
    assert type(record.value["point"]) is Point and type(record.value["pair"]) is tuple
    assert type(record.key) is tuple


def test_a_value_that_cannot_travel_is_named_by_its_type():
    from shared.values import ValueTypeError

    with pytest.raises(ValueTypeError, match="a value of type builtins.set cannot be sent between tasks"):
        encode_frame(0, 0, 1, 1, 0, False, 0, [Record({1, 2}, 1)])


def test_window_results_cross_the_wire_as_themselves():
    from gearbus import WindowResult

    result = WindowResult("k", 3, 0, 10, "on_time")
    _, frame = FrameReader().feed(encode_frame(0, 0, 1, 1, 0, False, 0, [Record(result, 9, "k")]))
    assert type(frame.records[0].value) is WindowResult and frame.records[0].value.final


def test_barrier_and_epoch_travel_in_the_frame():
    _, frame = FrameReader().feed(encode_frame(3, 1, 7, 2, 500, True, 42, []))
    assert (frame.epoch, frame.barrier, frame.eos, frame.watermark) == (7, 42, True, 500)


def test_leftover_fragments_of_a_dead_attempt_are_not_glued_to_the_next_one():
    old = split_message(encode_frame(0, 0, 1, 1, 0, False, 0, [Record("o" * 5000, 1)]), 0, 0, 1, 1000)
    new = split_message(encode_frame(0, 0, 2, 1, 0, False, 0, [Record("n" * 5000, 1)]), 0, 0, 2, 1000)
    reader = FrameReader()
    for part in old[:2]:  # the old attempt died mid-frame
        assert reader.feed(part) == ((0, 0), None)
    frames = [f for part in new for _, f in [reader.feed(part)] if f is not None]
    assert [(f.epoch, f.records[0].value) for f in frames] == [(2, "n" * 5000)]


def test_reassembly_memory_is_capped():
    parts = split_message(encode_frame(0, 0, 1, 1, 0, False, 0, [Record("x" * 50_000, 1)]), 0, 0, 1, 1000)
    reader = FrameReader(max_bytes=20_000)
    with pytest.raises(DataPlaneError, match="would pass 20000 bytes"):
        for part in parts:
            reader.feed(part)
    assert reader.pending_bytes <= 20_000


def test_reassembly_memory_is_capped_across_senders_that_never_finish():
    """Fragments claiming ever new senders cannot grow memory past the cap either."""
    reader = FrameReader(max_bytes=20_000)
    part = split_message(encode_frame(0, 0, 1, 1, 0, False, 0, [Record("x" * 5000, 1)]), 0, 0, 1, 1000)[0]
    refused = 0
    for sender in range(100):
        forged = bytes([part[0]]) + sender.to_bytes(4, "big") + part[5:]
        try:
            reader.feed(forged)
        except DataPlaneError:
            refused += 1
        assert reader.pending_bytes <= 20_000
    assert refused > 0 and reader.pending_bytes > 0


@pytest.mark.parametrize("data", [b"", b"\x93\x01\x02\x03", b"\x94\x01\x02\x03\xff", b"\x94\x01\x02\x03\x04",
                                  b"\x95\x01\x02\x03\x04\x00", b"\x95\x01\x02\x03\x04\xff"])
def test_malformed_credit_is_a_data_plane_error(data):
    from gearbus.runtime.frames import decode_credit

    with pytest.raises(DataPlaneError):
        decode_credit(data)


def test_a_credit_grant_carries_the_receivers_window():
    from gearbus.runtime.frames import decode_credit, encode_credit

    assert decode_credit(encode_credit(3, 1, 7, 42, 5)) == (3, 1, 7, 42, 5)


def test_a_parking_barrier_travels_as_an_eleventh_element_true_and_other_frames_keep_ten():
    parking = encode_frame(3, 1, 7, 2, 500, False, 42, [], park=True)
    plain = encode_frame(3, 1, 7, 2, 500, False, 42, [])
    assert values.unpack(parking[1:])[10:] == [True] and len(values.unpack(plain[1:])) == 10
    _, frame = FrameReader().feed(parking)
    assert (frame.barrier, frame.park) == (42, True)
    assert FrameReader().feed(plain)[1].park is False


@pytest.mark.parametrize("barrier, extra", [(0, [True]), (42, [False]), (42, [1]), (42, ["yes"]), (42, [None]),
                                            (42, [True, True])], ids=["no_barrier", "false", "one", "string", "nil",
                                                                      "twelve_elements"])
def test_park_anywhere_but_as_an_eleventh_true_on_a_barrier_is_malformed(barrier, extra):
    data = bytes([WHOLE]) + values.pack([3, 1, 7, 2, 500, False, barrier, [], [], None, *extra])
    with pytest.raises(MalformedFrame, match="eleventh element"):
        FrameReader().feed(data)
