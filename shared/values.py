"""User values on the data plane: msgpack that keeps Python's shape.

Plain msgpack turns tuples into lists, so a pipeline would behave differently once a
value crossed a process. Here a tuple travels as an extension type and comes back a
tuple, and registered NamedTuple types (window results, ...) come back as themselves.
Subclasses of dict, list, str, int and float travel as their base type. Anything else
is refused with an error that names the type.
"""

from __future__ import annotations

import msgpack

from shared.messages import ProtocolError

TUPLE_EXT = 1
#: Tuples inside tuples each cost a C unpacker (tens of KB of C stack) to decode: deeper input
#: is refused before the stack could overflow (msgpack's own limit covers lists and maps).
MAX_TUPLE_NESTING = 100
_types_by_code: dict[int, type] = {}
_codes_by_type: dict[type, int] = {}


class ValueTypeError(TypeError):
    """A value cannot travel between tasks."""


class ValueDecodeError(ProtocolError):
    """Bytes that are not values this module encoded; the text says why."""


def register_tuple_type(code: int, cls: type) -> None:
    """Let a NamedTuple class travel as itself (codes 2..127; 1 is plain tuple)."""
    if not 2 <= code <= 127:
        raise ValueError(f"extension code must be in 2..127, got {code}")
    known = _types_by_code.get(code)
    if known is not None and known is not cls:
        raise ValueError(f"extension code {code} is taken by {known.__name__}")
    _types_by_code[code] = cls
    _codes_by_type[cls] = code


def _default(obj):
    if isinstance(obj, tuple):
        nested = msgpack.packb(list(obj), use_bin_type=True, strict_types=True, default=_default)
        return msgpack.ExtType(_codes_by_type.get(type(obj), TUPLE_EXT), nested)
    for base in (dict, list, str, int, float, bytes):
        if isinstance(obj, base):
            return base(obj)
    raise ValueTypeError(
        f"a value of type {type(obj).__module__}.{type(obj).__qualname__} cannot be sent between tasks; "
        "use None, bool, int, float, str, bytes, list, tuple or dict"
    )


def _ext_hook_over(deeper):
    """An ext hook for one level of tuple nesting; ``deeper`` decodes the next level. A
    chain of MAX_TUPLE_NESTING of them bounds the depth at no cost per value."""

    def ext_hook(code: int, data: bytes):
        if code == TUPLE_EXT:
            items = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=deeper)
            if type(items) is list:
                return tuple(items)
            raise ValueDecodeError(f"a tuple extension holds a {type(items).__name__}, not a list of items")
        cls = _types_by_code.get(code)
        if cls is None:
            return msgpack.ExtType(code, data)
        items = msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=deeper)
        try:
            return cls(*items)
        except TypeError as exc:
            raise ValueDecodeError(f"extension {code} ({cls.__name__}) with items {items!r:.80}: {exc}") from None

    return ext_hook


def _too_deep(code: int, data: bytes):
    if code == TUPLE_EXT or code in _types_by_code:
        raise ValueDecodeError(f"values nested more than {MAX_TUPLE_NESTING} tuples deep")
    return msgpack.ExtType(code, data)


_ext_hook = _too_deep
for _ in range(MAX_TUPLE_NESTING):
    _ext_hook = _ext_hook_over(_ext_hook)
_packer = msgpack.Packer(use_bin_type=True, strict_types=True, default=_default)


def pack(obj) -> bytes:
    return _packer.pack(obj)


def unpack(data):
    """The value ``pack`` encoded; ValueDecodeError for any other bytes."""
    try:
        return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)
    except ProtocolError:
        raise
    except Exception as exc:  # msgpack's errors (ExtraData, FormatError, StackError, ...) and unhashable keys
        raise ValueDecodeError(f"not a msgpack value ({type(exc).__name__}{': ' + str(exc) if str(exc) else ''})") \
            from None
