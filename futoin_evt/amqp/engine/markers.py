"""The AMQP types that Python has no value of its own for, as marker subclasses of ``int``,
``float``, ``str`` and ``bytes`` (see :mod:`.types`, which exports them).

A module of their own: :mod:`.types` is compiled with mypyc, which cannot compile subclasses
of these built-in types; here they stay ordinary classes.
"""

from __future__ import annotations


class UByte(int):
    __slots__ = ()


class UShort(int):
    __slots__ = ()


class UInt(int):
    __slots__ = ()


class ULong(int):
    __slots__ = ()


class Byte(int):
    __slots__ = ()


class Short(int):
    __slots__ = ()


class Int(int):
    __slots__ = ()


class Timestamp(int):
    """Milliseconds since the Unix epoch."""

    __slots__ = ()


class Float(float):
    """A 32-bit float (a plain ``float`` is a double)."""

    __slots__ = ()


class Char(str):
    """One UTF-32 character."""

    __slots__ = ()


class Symbol(str):
    __slots__ = ()


class Decimal32(bytes):
    """4 raw bytes of IEEE 754 decimal32."""


class Decimal64(bytes):
    """8 raw bytes of IEEE 754 decimal64."""


class Decimal128(bytes):
    """16 raw bytes of IEEE 754 decimal128."""
