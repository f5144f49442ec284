"""Data-plane frames: the unit one task sends another over NATS.

A frame is the msgpack array ``[src_processor, src_index, epoch, seq, watermark, eos,
barrier, values, timestamps, keys]``: the records column by column (``keys`` is nil when
no record has a key), values encoded by :mod:`shared.values` so tuples stay tuples. A
barrier that asks its receivers to park after their snapshot (a change's checkpoint) has
an eleventh element, ``true``.
Control travels in band, in this order after the records: the watermark (which holds
after them), a checkpoint barrier (0 for none), end-of-stream. ``epoch`` is the sender's
attempt: receivers drop frames of any other. Every NATS message starts with one byte:
0 for a whole frame; 1 (more follow) or 2 (last) for a fragment of a frame larger than
the server's max_payload, followed by the sender's processor, index and epoch
(big-endian uint32 each).
"""

from __future__ import annotations

import struct
from operator import itemgetter

import msgpack

from gearbus.api.task import Record, new_record
from gearbus.runtime.core import DataPlaneError, Frame
from shared import values
from shared.messages import ProtocolError

WHOLE, FRAGMENT, LAST_FRAGMENT = 0, 1, 2
_FRAGMENT_HEADER = struct.Struct(">BIII")
_WHOLE_PREFIX = bytes([WHOLE])
DEFAULT_MAX_REASSEMBLY_BYTES = 64 << 20

__all__ = ["DataPlaneError", "Frame", "FrameReader", "MalformedFrame", "decode_credit", "encode_credit",
           "encode_frame", "split_message"]


class MalformedFrame(DataPlaneError, ProtocolError):
    """Data-plane bytes that are not a frame or a credit grant: a protocol error, and a
    broken stream (the task recovers as from any data-plane failure)."""


_packer = msgpack.Packer(use_bin_type=True)
_value, _timestamp, _key = itemgetter(0), itemgetter(1), itemgetter(2)


def encode_frame(src_processor, src_index, epoch, seq, watermark, eos, barrier, records, park=False) -> bytes:
    """Encode a frame; a value that cannot travel raises shared.values.ValueTypeError."""
    keys = list(map(_key, records))
    if keys.count(None) == len(keys):
        keys = None
    columns = [src_processor, src_index, epoch, seq, watermark, eos, barrier,
               list(map(_value, records)), list(map(_timestamp, records)), keys]
    if park:
        columns.append(True)
    return _WHOLE_PREFIX + values.pack(columns)


def split_message(data: bytes, src_processor: int, src_index: int, epoch: int, max_bytes: int) -> list[bytes]:
    """Cut an encoded frame into NATS messages of at most ``max_bytes`` each."""
    if len(data) <= max_bytes:
        return [data]
    body = memoryview(data)[1:]
    step = max_bytes - _FRAGMENT_HEADER.size
    parts = [body[i : i + step] for i in range(0, len(body), step)]
    last = len(parts) - 1
    return [
        _FRAGMENT_HEADER.pack(LAST_FRAGMENT if n == last else FRAGMENT, src_processor, src_index, epoch) + part
        for n, part in enumerate(parts)
    ]


def encode_credit(processor: int, index: int, epoch: int, consumed: int, window: int) -> bytes:
    """Receiver (processor, index) of attempt ``epoch`` has processed ``consumed`` frames
    and takes ``window`` more."""
    return _packer.pack([processor, index, epoch, consumed, window])


def decode_credit(data: bytes) -> tuple[int, int, int, int, int]:
    """(receiver processor, receiver index, epoch, consumed, window); MalformedFrame when malformed."""
    try:
        processor, index, epoch, consumed, window = msgpack.unpackb(data)
        if not all(type(v) is int for v in (processor, index, epoch, consumed, window)) or consumed < 0 or window < 1:
            raise ValueError("expected four non-negative integers and a window of at least 1")
        return processor, index, epoch, consumed, window
    except Exception as exc:
        raise MalformedFrame(f"malformed credit grant: {type(exc).__name__}: {exc}") from None


class FrameReader:
    """Turns the NATS messages of one inbox back into frames, reassembling fragments.

    Reassembly is per sender and attempt: fragments of another epoch, or a whole frame
    from the same sender, discard what was pending (a dead attempt's leftovers are never
    glued to a live one's frame). All pending fragments together may not pass
    ``max_bytes``, however many senders claim to be sending.
    """

    def __init__(self, max_bytes: int = DEFAULT_MAX_REASSEMBLY_BYTES):
        self.max_bytes = max_bytes
        self._partial: dict[tuple[int, int], tuple[int, list[bytes], int]] = {}
        self.pending_bytes = 0

    def _drop(self, sender: tuple[int, int]) -> None:
        held = self._partial.pop(sender, None)
        if held is not None:
            self.pending_bytes -= held[2]

    def feed(self, data: bytes) -> tuple[tuple[int, int] | None, Frame | None]:
        """Return (sender, frame); frame is None while a fragmented frame is incomplete.

        The sender of a whole frame is only known once decoded, so it comes back as
        part of the frame.
        """
        if not data:
            raise MalformedFrame("empty data message")
        kind = data[0]
        if kind == WHOLE:
            frame = self._decode(memoryview(data)[1:])
            self._drop((frame.src_processor, frame.src_index))
            return (frame.src_processor, frame.src_index), frame
        if kind not in (FRAGMENT, LAST_FRAGMENT):
            raise MalformedFrame(f"unknown data message kind {kind}")
        if len(data) < _FRAGMENT_HEADER.size:
            raise MalformedFrame(f"a fragment of {len(data)} bytes is shorter than its header")
        _, processor, index, epoch = _FRAGMENT_HEADER.unpack_from(data)
        sender = (processor, index)
        held_epoch, parts, size = self._partial.get(sender) or (epoch, [], 0)
        if held_epoch != epoch:
            self._drop(sender)
            parts, size = [], 0
        part = data[_FRAGMENT_HEADER.size :]
        if self.pending_bytes + len(part) > self.max_bytes:
            self._drop(sender)
            raise MalformedFrame(f"fragmented frames pending from task {sender} and others would pass "
                                 f"{self.max_bytes} bytes")
        parts.append(part)
        self._partial[sender] = (epoch, parts, size + len(part))
        self.pending_bytes += len(part)
        if kind == FRAGMENT:
            return sender, None
        self._drop(sender)
        frame = self._decode(b"".join(parts))
        if (frame.src_processor, frame.src_index, frame.epoch) != (processor, index, epoch):
            raise MalformedFrame(f"fragments from task {sender} epoch {epoch} carried a frame of "
                                 f"task {(frame.src_processor, frame.src_index)} epoch {frame.epoch}")
        return sender, frame

    @staticmethod
    def _decode(buffer) -> Frame:
        try:
            src_processor, src_index, epoch, seq, watermark, eos, barrier, vals, stamps, keys, *park = \
                values.unpack(buffer)
            if len(park) > 1 or park and (park[0] is not True or not barrier):
                raise ValueError("only a barrier may carry an eleventh element, true (park)")
            if not all(type(v) is int for v in (src_processor, src_index, epoch, seq, watermark, barrier)):
                raise ValueError("its processor, index, epoch, sequence, watermark and barrier must be integers")
            if type(eos) is not bool or type(vals) is not list or type(stamps) is not list or \
                    (keys is not None and type(keys) is not list):
                raise ValueError("expected a bool end-of-stream and lists of values, timestamps and keys")
            if len(vals) != len(stamps) or (keys is not None and len(keys) != len(vals)):
                raise ValueError("the value, timestamp and key columns differ in length")
            if keys is None:
                records = [new_record(Record, (v, t, None)) for v, t in zip(vals, stamps)]
            else:
                records = [new_record(Record, r) for r in zip(vals, stamps, keys)]
            return Frame(src_processor, src_index, epoch, seq, watermark, eos, barrier, records, bool(park))
        except Exception as exc:
            raise MalformedFrame(f"malformed data frame: {type(exc).__name__}: {exc}") from None
