"""Data-plane frames: the unit one task sends another over NATS.

A frame is the msgpack array ``[src_processor, src_index, session, seq, watermark,
eos, values, timestamps, keys]``: the records column by column (``keys`` is nil when no
record has a key), values encoded by :mod:`shared.values` so tuples stay tuples.
Control travels in band: the watermark rides every frame (it holds after the frame's
records) and end-of-stream is a flag, so both stay in order with the records. Every NATS message starts with one byte: 0 for a whole frame;
1 (more follow) or 2 (last) for a fragment of a frame larger than the server's
max_payload, followed by the sender's processor and index (big-endian uint32 each).
"""

from __future__ import annotations

import struct
from operator import itemgetter
from typing import NamedTuple

import msgpack

from gearbus.api.task import Record, new_record
from shared import values

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
_value, _timestamp, _key = itemgetter(0), itemgetter(1), itemgetter(2)


def encode_frame(src_processor, src_index, session, seq, watermark, eos, records) -> bytes:
    """Encode a frame; a value that cannot travel raises shared.values.ValueTypeError."""
    keys = list(map(_key, records))
    if keys.count(None) == len(keys):
        keys = None
    columns = [src_processor, src_index, session, seq, watermark, eos,
               list(map(_value, records)), list(map(_timestamp, records)), keys]
    return _WHOLE_PREFIX + values.pack(columns)


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


def encode_credit(processor: int, index: int, frames: int, reset: bool = False) -> bytes:
    """A grant of ``frames`` more; with ``reset``, the receiver is a new incarnation (a
    restarted task) and the sender's credit becomes exactly ``frames``."""
    return _packer.pack([processor, index, frames, reset])


def decode_credit(data: bytes) -> tuple[int, int, int, bool]:
    try:
        processor, index, frames, *rest = msgpack.unpackb(data)
        return int(processor), int(index), int(frames), bool(rest and rest[0])
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
            src_processor, src_index, session, seq, watermark, eos, vals, stamps, keys = values.unpack(buffer)
            if len(vals) != len(stamps) or (keys is not None and len(keys) != len(vals)):
                raise ValueError("the value, timestamp and key columns differ in length")
            if keys is None:
                records = [new_record(Record, (v, t, None)) for v, t in zip(vals, stamps)]
            else:
                records = [new_record(Record, r) for r in zip(vals, stamps, keys)]
            return Frame(src_processor, src_index, session, seq, watermark, eos, records)
        except Exception as exc:
            raise DataPlaneError(f"malformed data frame: {type(exc).__name__}: {exc}") from None
