"""Source filters as a start position plus a predicate, with no I/O.

The ``event-streams-sql`` filter and the Event Hubs selector form share one grammar
(``filter.lark``). Every comparison is put in one of two domains: event ids (offsets, Event
Hubs offsets and sequence numbers) or milliseconds since the epoch (timestamps). A compiled
filter tells where reading can start (a lower bound, conservative under OR) and checks each
event read after it.
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from lark import Lark, LarkError, Token, Transformer, v_args

from ..domain.comparisons import COMPARISONS, FLIPPED
from ..domain.stream import StoredEvent
from ..quoting import quote_input
from .codec import EARLIEST, LATEST, BadFilter, Position, parse_offset

#: Longest filter text accepted.
MAX_FILTER_CHARS: Final = 4096


class Domain(enum.Enum):
    ID = "id"
    MS = "ms"


#: (section, name) -> the domain a field compares in. ``d`` is ``delivery_annotations``.
FIELDS: Final = {
    ("delivery_annotations", "event-streams-offset"): Domain.ID,
    ("delivery_annotations", "event-streams-timestamp"): Domain.MS,
    ("amqp.annotation", "x-opt-offset"): Domain.ID,
    ("amqp.annotation", "x-opt-sequence-number"): Domain.ID,
    ("amqp.annotation", "x-opt-enqueued-time"): Domain.MS,
}


@dataclass(frozen=True, slots=True)
class Field:
    section: str
    name: str


@dataclass(frozen=True, slots=True)
class Constant:
    value: str | int


@dataclass(frozen=True, slots=True)
class Compare:
    left: Field | Constant
    op: str
    right: Field | Constant


@dataclass(frozen=True, slots=True)
class Logical:
    op: str  # "and" | "or"
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Boolean:
    value: bool


Expr = Compare | Logical | Boolean


@v_args(inline=True)
class _ToTree(Transformer[Token, Expr]):
    def field(self, token: Token) -> Field:
        section, _, name = str(token).rpartition(".")
        section = section.lower()
        if section == "d":
            section = "delivery_annotations"
        return Field(section, name.lower())

    def string(self, token: Token) -> Constant:
        return Constant(str(token)[1:-1].replace("''", "'"))

    def integer(self, token: Token) -> Constant:
        return Constant(int(token))

    def comparison(self, left: Any, op: Token, right: Any) -> Compare:
        return Compare(left, str(op), right)

    def boolean(self, token: Token) -> Boolean:
        return Boolean(str(token).upper() == "TRUE")

    def and_(self, left: Expr, right: Expr) -> Logical:
        return Logical("and", left, right)

    def or_(self, left: Expr, right: Expr) -> Logical:
        return Logical("or", left, right)


@functools.cache
def _parser() -> Lark:
    grammar = resources.files(__package__).joinpath("filter.lark").read_text()
    return Lark(grammar, parser="lalr", maybe_placeholders=False)


def parse_filter(text: str) -> Expr:
    """The syntax tree of a filter; raises :class:`BadFilter` with where it went wrong."""
    if len(text) > MAX_FILTER_CHARS:
        raise BadFilter(f"filter longer than {MAX_FILTER_CHARS} characters")
    try:
        tree = _parser().parse(text)
    except LarkError as exc:
        raise BadFilter(f"cannot parse the filter: {str(exc).splitlines()[0]}") from None
    result = _ToTree().transform(tree)
    assert isinstance(result, Compare | Logical | Boolean)
    return result


# -- compiling ----------------------------------------------------------------------------------

Predicate = Callable[[StoredEvent], bool]


@dataclass(frozen=True, slots=True)
class _Bound:
    """Reading may start after ``after_id`` and after ``after_ms`` (None: no time bound)."""

    after_id: int = 0
    after_ms: int | None = None


def compile_filter(text: str, *, head: int) -> Position:
    """A filter as where to start reading and what to deliver. ``@latest`` is ``head``."""
    expr = parse_filter(text)
    predicate, bound = _compile(expr, head)
    return Position(bound.after_id, bound.after_ms, predicate)


def _compile(expr: Expr, head: int) -> tuple[Predicate, _Bound]:
    if isinstance(expr, Boolean):
        value = expr.value
        return (lambda _e: value), _Bound()
    if isinstance(expr, Logical):
        left, left_bound = _compile(expr.left, head)
        right, right_bound = _compile(expr.right, head)
        if expr.op == "and":
            return (lambda e: left(e) and right(e)), _Bound(
                max(left_bound.after_id, right_bound.after_id),
                _max_ms(left_bound.after_ms, right_bound.after_ms),
            )
        return (lambda e: left(e) or right(e)), _Bound(
            min(left_bound.after_id, right_bound.after_id),
            _min_ms(left_bound.after_ms, right_bound.after_ms),
        )
    return _compile_compare(expr, head)


def _compile_compare(expr: Compare, head: int) -> tuple[Predicate, _Bound]:
    left, op, right = expr.left, expr.op, expr.right
    if isinstance(left, Constant) and isinstance(right, Field):
        left, op, right = right, FLIPPED[op], left
    if not isinstance(left, Field) or not isinstance(right, Constant):
        raise BadFilter("each comparison needs one field and one constant")
    domain = FIELDS.get((left.section, left.name))
    if domain is None:
        raise BadFilter(f"cannot filter on {left.section}.{left.name}")
    value = _constant(left, domain, right.value, head)
    compare = COMPARISONS[op]
    bound = _Bound()
    if domain is Domain.ID:
        if op in (">", ">=", "="):
            bound = _Bound(after_id=max(value - (op != ">"), 0))

        def by_id(event: StoredEvent) -> bool:
            return compare(event.id, value)

        return by_id, bound
    if op in (">", ">=", "="):
        bound = _Bound(after_ms=value - (op != ">"))

    def by_time(event: StoredEvent) -> bool:
        return compare(event.timestamp_ms, value)

    return by_time, bound


def _constant(field: Field, domain: Domain, value: str | int, head: int) -> int:
    """A constant in the field's domain."""
    if field.name == "event-streams-offset":
        if not isinstance(value, str):
            raise BadFilter("offsets are compared with strings: 'offset', '@earliest', '@latest'")
        return parse_offset(value, head=head)
    if isinstance(value, int):
        return value
    if domain is Domain.ID and value in (EARLIEST, LATEST):
        return 0 if value == EARLIEST else head
    try:
        return int(value)
    except ValueError:
        raise BadFilter(
            f"{field.name} is compared with a number, not {quote_input(value)}"
        ) from None


def _max_ms(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else max(a, b)


def _min_ms(a: int | None, b: int | None) -> int | None:
    return None if a is None or b is None else min(a, b)
