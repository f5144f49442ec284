"""Every decoder that reads bytes from the network, fuzzed: arbitrary bytes, valid msgpack of
the wrong shape, huge sizes, deep nesting and every message with each field mutated. Each
decoder either returns what it decodes or raises the one protocol error type (ProtocolError,
or ArtifactError for artifacts) with a message, never another exception.

Budget: under the ci hypothesis profile each decoder gets 10,000 examples per run, split
across the strategies below (the example counts are in the settings): most are raw bytes,
which hypothesis makes fast, and a thousand or so each are structured (slower to generate),
so the file runs in about half a minute. A local run draws a tenth of each count
(tests/support/fuzzing.py). Hypothesis draws new examples each run, so the runs add up."""

from __future__ import annotations

import dataclasses
import io
import os
import typing
import zipfile

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gearbus.api.task import Record
from gearbus.artifact import MAX_ARTIFACT_BYTES, ArtifactError, unpack_artifact
from gearbus.runtime.frames import FrameReader, decode_credit, encode_credit, encode_frame, split_message
from shared import messages, values
from shared.messages import PROTOCOL_VERSION, Message, ProtocolError, decode
from tests.support.fuzzing import examples

MESSAGE_TYPES = sorted(Message.registry.values(), key=lambda cls: cls.__name__)

# Any msgpack-able value, nested a little, with the scalar edge cases that break naive checks.
scalars = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**64 - 1),
                    st.floats(allow_nan=True), st.text(max_size=20), st.binary(max_size=20))
msgpack_values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.one_of(st.text(max_size=8), st.integers(-(2**63), 2**63 - 1)), inner, max_size=5)),
    max_leaves=20)
flat_values = st.one_of(scalars, st.lists(scalars, max_size=4))  # cheaper to generate, for the bulk


def expect_protocol_error(call, error_type=ProtocolError):
    """Run the decoder: success, or ``error_type`` with a message; anything else fails the test."""
    try:
        return call()
    except error_type as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return None


def nested(depth: int) -> bytes:
    """A msgpack array nested ``depth`` deep: ``[[[...]]]``."""
    return b"\x91" * depth + b"\xc0"


# --- shared.messages.decode: 8,000 + 1,000 + 1,000 = 10,000 examples ---------------------


@settings(max_examples=examples(8000), deadline=None)
@given(st.binary(max_size=200))
def test_decode_of_arbitrary_bytes(data):
    expect_protocol_error(lambda: decode(data))


@settings(max_examples=examples(1000), deadline=None)
@given(msgpack_values, st.sampled_from([None, *[cls.__name__ for cls in MESSAGE_TYPES], "Nope", 7]),
       st.sampled_from([PROTOCOL_VERSION, None, 2, "1"]))
def test_decode_of_valid_msgpack_of_the_wrong_shape(body, tag, version):
    if isinstance(body, dict):
        body = {**body, "type": tag, "v": version}
    expect_protocol_error(lambda: decode(msgpack.packb(body, use_bin_type=True)))


def _example_value(hint):
    """A valid value of a field's annotated type (the base each mutation starts from)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is typing.Any:
        return None
    if origin in (typing.Union, getattr(__import__("types"), "UnionType")):
        return None
    if origin in (list, tuple):
        return []
    if origin is dict:
        return {}
    if isinstance(hint, type) and issubclass(hint, messages.Struct):
        return _example_wire(hint)
    return {int: 1, float: 1.0, str: "x", bool: True, bytes: b"x"}[hint]


def _example_wire(cls) -> dict:
    hints = typing.get_type_hints(cls)
    return {f.name: _example_value(hints[f.name]) for f in dataclasses.fields(cls)}


@settings(max_examples=examples(1000), deadline=None)
@given(st.sampled_from(MESSAGE_TYPES), st.data())
def test_decode_of_every_message_with_a_field_mutated(cls, data):
    body = {**_example_wire(cls), "type": cls.__name__, "v": PROTOCOL_VERSION}
    assert decode(msgpack.packb(body, use_bin_type=True)) is not None  # the base is valid
    field = data.draw(st.sampled_from([f.name for f in dataclasses.fields(cls)] or ["type"]))
    action = data.draw(st.sampled_from(["replace", "drop", "nest"]))
    if action == "replace":
        body[field] = data.draw(msgpack_values)
    elif action == "drop":
        body.pop(field, None)
    else:
        body[field] = [body.get(field)] * data.draw(st.integers(0, 3))
    decoded = expect_protocol_error(lambda: decode(msgpack.packb(body, use_bin_type=True)))
    assert decoded is None or type(decoded) is cls


@pytest.mark.parametrize("data", [
    nested(100_000),  # deep nesting
    b"\xdd\xff\xff\xff\xff",  # an array announcing 4 billion items
    b"\xdf\xff\xff\xff\xff",  # a map announcing 4 billion pairs
    b"\xdb\xff\xff\xff\xff",  # a string announcing 4 GB
    b"\x81\x91\x01\x01",  # a map with an unhashable (array) key
    b"\xc1",  # a reserved byte
])
def test_decode_of_huge_sizes_and_deep_nesting(data):
    with pytest.raises(ProtocolError):
        decode(data)


def test_decode_refuses_an_oversized_message_before_reading_it():
    with pytest.raises(ProtocolError, match="exceeds the limit"):
        decode(b"\x00" * (messages.MAX_MESSAGE_BYTES + 1))


# --- shared.values.unpack: 8,000 + 2,000 = 10,000 examples ------------------------------


@settings(max_examples=examples(8000), deadline=None)
@given(st.binary(max_size=200))
def test_values_unpack_of_arbitrary_bytes(data):
    expect_protocol_error(lambda: values.unpack(data))


@settings(max_examples=examples(2000), deadline=None)
@given(st.integers(0, 127), flat_values)
def test_values_unpack_of_extension_types_holding_anything(code, inner):
    data = msgpack.packb(msgpack.ExtType(code, msgpack.packb(inner, use_bin_type=True)), use_bin_type=True)
    expect_protocol_error(lambda: values.unpack(data))


def test_values_unpack_of_tuples_nested_past_the_limit():
    value = None
    for _ in range(3000):  # each level is a tuple extension holding the next: a Python frame or two each
        value = msgpack.ExtType(values.TUPLE_EXT, msgpack.packb([value]))
    with pytest.raises(ProtocolError, match="nested more than 100 tuples deep"):
        values.unpack(msgpack.packb(value))


# --- data-plane frames: 8,500 + 1,000 + 500 = 10,000 examples ---------------------------


@settings(max_examples=examples(8500), deadline=None)
@given(st.lists(st.binary(max_size=120), min_size=1, max_size=3))
def test_frame_reader_of_arbitrary_messages(messages_in):
    reader = FrameReader(max_bytes=4096)
    for data in messages_in:
        expect_protocol_error(lambda: reader.feed(data))
        assert 0 <= reader.pending_bytes <= 4096


@settings(max_examples=examples(1000), deadline=None)
@given(st.lists(flat_values, min_size=0, max_size=11), st.sampled_from([0, 1, 2]))
def test_frame_reader_of_msgpack_of_the_wrong_shape(columns, kind):
    body = msgpack.packb(columns, use_bin_type=True)
    data = bytes([kind]) + (b"" if kind == 0 else b"\x00" * 12) + body
    expect_protocol_error(lambda: FrameReader().feed(data))


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(st.tuples(flat_values, st.integers(-(2**40), 2**40)), max_size=20),
       st.integers(200, 2000), st.data())
def test_fragments_cut_anywhere_and_shuffled_never_escape_the_protocol_error(records, max_bytes, data):
    """Well-formed frames, fragmented, then some fragments dropped, duplicated or swapped."""
    encoded = encode_frame(1, 0, 3, 1, 100, False, 0, [Record(v, t) for v, t in records])
    parts = split_message(encoded, 1, 0, 3, max_bytes)
    mangled = data.draw(st.lists(st.sampled_from(parts), max_size=len(parts) + 2))
    reader = FrameReader(max_bytes=len(encoded) + 64)
    for part in mangled:
        expect_protocol_error(lambda: reader.feed(part))
    complete = FrameReader().feed
    for part in parts[:-1]:
        assert complete(part) == ((1, 0), None)
    _, frame = complete(parts[-1])
    assert values.pack([(r.value, r.timestamp) for r in frame.records]) == values.pack(records)  # NaN too


# --- credit grants: 9,000 + 1,000 = 10,000 examples -------------------------------------


@settings(max_examples=examples(9000), deadline=None)
@given(st.binary(max_size=60))
def test_decode_credit_of_arbitrary_bytes(data):
    expect_protocol_error(lambda: decode_credit(data))


@settings(max_examples=examples(1000), deadline=None)
@given(st.lists(flat_values, max_size=6))
def test_decode_credit_of_msgpack_of_the_wrong_shape(fields):
    decoded = expect_protocol_error(lambda: decode_credit(msgpack.packb(fields, use_bin_type=True)))
    if decoded is not None:
        assert decode_credit(encode_credit(*decoded)) == decoded


# --- artifacts: 6,000 + 4,000 = 10,000 examples -----------------------------------------


def _zip(entries: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, content in entries.items():
            zf.writestr(name, content)
    return buffer.getvalue()


@settings(max_examples=examples(6000), deadline=None)
@given(st.binary(max_size=300), st.sampled_from(["zip", "module", "tar", ""]),
       st.sampled_from(["app", "../evil", "a/b", "", "x y"]))
def test_artifact_unpacking_of_arbitrary_bytes(tmp_path_factory, data, kind, entry):
    workdir = tmp_path_factory.mktemp("artifact")
    path = expect_protocol_error(lambda: unpack_artifact(data, kind, entry, str(workdir)), ArtifactError)
    assert path is None or os.path.dirname(path) == str(workdir)
    assert all(not name.startswith(".") for name in os.listdir(workdir))


@settings(max_examples=examples(4000), deadline=None)
@given(st.dictionaries(st.sampled_from(["app/__init__.py", "app/m.py", "../x.py", "/etc/x", "app/../../y",
                                        "C:/z", "other/__init__.py", "app\\..\\w"]),
                       st.binary(max_size=40), max_size=4))
def test_artifact_unpacking_of_zips_with_any_names(tmp_path_factory, entries):
    workdir = tmp_path_factory.mktemp("artifact")
    path = expect_protocol_error(lambda: unpack_artifact(_zip(entries), "zip", "app", str(workdir)), ArtifactError)
    safe = all(not (n.startswith("/") or ".." in n.replace("\\", "/").split("/") or ":" in n) for n in entries)
    assert (path is not None) == (safe and "app/__init__.py" in entries)
    assert os.listdir(workdir) == (["app.zip"] if path else [])


def test_a_zip_bomb_is_refused_before_anything_inflates(tmp_path):
    bomb = io.BytesIO()
    with zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("app/__init__.py", b"")
        for n in range(3):
            zf.writestr(f"app/zeros{n}.py", b"\0" * (MAX_ARTIFACT_BYTES // 2))
    with pytest.raises(ArtifactError, match="inflate past"):
        unpack_artifact(bomb.getvalue(), "zip", "app", str(tmp_path))
    assert os.listdir(tmp_path) == []
