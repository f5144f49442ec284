"""Data-plane frames: the unit one task sends another over NATS.

A frame is the msgpack array ``[src_processor, src_index, session, seq, watermark,
eos, records]`` where each record is ``[value, timestamp, key]``. Control travels in
band: the watermark rides every frame and end-of-stream is a flag, so both stay in
order with the records. Every NATS message starts with one byte: 0 for a whole frame;
1 (more follow) or 2 (last) for a fragment of a frame larger than the server's
max_payload, followed by the sender's processor and index (big-endian uint32 each).
"""

from __future__ import annotations

import struct
from typing import NamedTuple

import msgpack

from gearbus.api.task import Record, new_record

WATERMARK_MAX = 2**63 - 1  # the final watermark of a bounded input (+inf)
WHOLE, FRAGMENT, LAST_FRAGMENT = 0, 1, 2
_FRAGMENT_HEADER = struct.Struct(">BII")
_WHOLE_PREFIX = bytes([WHOLE])


class DataPlaneError(RuntimeError):
    """A frame was malformed, lost or out of order."""


class Frame(NamedTuple):
    src_processor: int
    src_index: int
    session: int
    seq: int
    watermark: int
    eos: bool
    records: list[Record]


_packer = msgpack.Packer(use_bin_type=True)


def encode_frame(src_processor, src_index, session, seq, watermark, eos, records) -> bytes:
    return _WHOLE_PREFIX + _packer.pack([src_processor, src_index, session, seq, watermark, eos, records])


def split_message(data: bytes, src_processor: int, src_index: int, max_bytes: int) -> list[bytes]:
    """Cut an encoded frame into NATS messages of at most ``max_bytes`` each."""
    if len(data) <= max_bytes:
        return [data]
    body = memoryview(data)[1:]
    step = max_bytes - _FRAGMENT_HEADER.size
    parts = [body[i : i + step] for i in range(0, len(body), step)]
    last = len(parts) - 1
    return [
        _FRAGMENT_HEADER.pack(LAST_FRAGMENT if n == last else FRAGMENT, src_processor, src_index) + part
        for n, part in enumerate(parts)
    ]


def encode_credit(processor: int, index: int, frames: int) -> bytes:
    return _packer.pack([processor, index, frames])


def decode_credit(data: bytes) -> tuple[int, int, int]:
    try:
        processor, index, frames = msgpack.unpackb(data)
        return int(processor), int(index), int(frames)
    except Exception as exc:
        raise DataPlaneError(f"malformed credit grant: {exc}") from None


class FrameReader:
    """Turns the NATS messages of one inbox back into frames, reassembling fragments."""

    def __init__(self):
        self._partial: dict[tuple[int, int], list[bytes]] = {}

    def feed(self, data: bytes) -> tuple[tuple[int, int] | None, Frame | None]:
        """Return (sender, frame); frame is None while a fragmented frame is incomplete.

        The sender of a whole frame is only known once decoded, so it comes back as
        part of the frame.
        """
        if not data:
            raise DataPlaneError("empty data message")
        kind = data[0]
        if kind == WHOLE:
            frame = self._decode(memoryview(data)[1:])
            return (frame.src_processor, frame.src_index), frame
        if kind not in (FRAGMENT, LAST_FRAGMENT) or len(data) < _FRAGMENT_HEADER.size:
            raise DataPlaneError(f"unknown data message kind {kind}")
        _, processor, index = _FRAGMENT_HEADER.unpack_from(data)
        sender = (processor, index)
        parts = self._partial.setdefault(sender, [])
        parts.append(data[_FRAGMENT_HEADER.size :])
        if kind == FRAGMENT:
            return sender, None
        del self._partial[sender]
        return sender, self._decode(b"".join(parts))

    @staticmethod
    def _decode(buffer) -> Frame:
        try:
            src_processor, src_index, session, seq, watermark, eos, raw = msgpack.unpackb(
                buffer, raw=False, strict_map_key=False
            )
            if raw and set(map(len, raw)) != {3}:
                raise ValueError("every record must be [value, timestamp, key]")
            return Frame(src_processor, src_index, session, seq, watermark, eos, [new_record(Record, r) for r in raw])
        except Exception as exc:
            raise DataPlaneError(f"malformed data frame: {type(exc).__name__}: {exc}") from None
