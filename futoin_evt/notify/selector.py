"""Selectors: the APACHE.ORG:SELECTOR language, parsed once and compiled to a predicate.

``selector.lark`` is the grammar (an LALR parser, so parsing never recurses). A selector
longer than :data:`MAX_SELECTOR_CHARS` or nested deeper than :data:`MAX_DEPTH` is refused
before its tree is walked. The tree becomes a few dataclasses, then nested closures over a
:class:`~.message.Notification`: nothing is evaluated with ``eval``.

Semantics are SQL's three-valued logic, with NULL (None) for a missing attribute:
comparisons and arithmetic with NULL are NULL; ``AND``/``OR``/``NOT`` follow the SQL truth
tables; a notification matches only when the selector is TRUE. Values of different kinds
(a number and a string, a boolean and a number) do not compare: the comparison is NULL.
Strings and booleans compare with ``=`` and ``<>``; strings also order (``ts >= '2026-…'``).
Division of two integers truncates toward zero, as in Java; division by zero is NULL.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

from lark import Lark, Token, Transformer, Tree, UnexpectedCharacters, UnexpectedInput, v_args
from lark.exceptions import UnexpectedEOF, VisitError

from ..domain.comparisons import COMPARISONS, FLIPPED
from ..domain.notification import BASE_ATTRIBUTES, EVENT_TYPE, STREAM, Notification, Value
from .message import NotifyError, getter

#: Longest selector accepted (characters).
MAX_SELECTOR_CHARS: Final = 4096
#: Deepest nesting of parentheses and operators accepted.
MAX_DEPTH: Final = 64

#: Truthy when the notification matches (TRUE); FALSE and NULL do not.
Predicate = Callable[[Notification], bool | None]
_Eval = Callable[[Notification], Value]


class SelectorError(NotifyError):
    """A selector that cannot be used; ``column`` is where it went wrong (1-based), if known."""

    def __init__(self, message: str, column: int | None = None) -> None:
        super().__init__(f"{message} (at column {column})" if column is not None else message)
        self.column = column


# -- the tree ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Identifier:
    name: str


@dataclass(frozen=True, slots=True)
class Literal:
    value: Value


@dataclass(frozen=True, slots=True)
class Compare:
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Arithmetic:
    op: str
    left: Expr
    right: Expr


@dataclass(frozen=True, slots=True)
class Negate:
    operand: Expr


@dataclass(frozen=True, slots=True)
class Logical:
    op: str  # "and" | "or"
    operands: tuple[Expr, ...]


@dataclass(frozen=True, slots=True)
class Not:
    operand: Expr


@dataclass(frozen=True, slots=True)
class Between:
    operand: Expr
    low: Expr
    high: Expr
    negated: bool


@dataclass(frozen=True, slots=True)
class In:
    operand: Expr
    values: tuple[Value, ...]
    negated: bool


@dataclass(frozen=True, slots=True)
class Like:
    operand: Expr
    pattern: str
    escape: str | None
    negated: bool


@dataclass(frozen=True, slots=True)
class IsNull:
    operand: Expr
    negated: bool


Expr = (
    Identifier | Literal | Compare | Arithmetic | Negate | Logical | Not | Between | In | Like
    | IsNull
)  # fmt: skip


@v_args(inline=True)
class _ToTree(Transformer[Token, Expr]):
    def identifier(self, token: Token) -> Identifier:
        return Identifier(str(token))

    def string(self, token: Token) -> Literal:
        return Literal(str(token)[1:-1].replace("''", "'"))

    def number(self, token: Token) -> Literal:
        text = str(token)
        if text[:2] in ("0x", "0X"):
            return Literal(int(text, 16))
        if text[-1] in "lL":
            return Literal(int(text[:-1]))
        if any(c in text for c in ".eEfFdD"):
            value = float(text.rstrip("fFdD"))
            if value != value or value in (float("inf"), float("-inf")):
                raise SelectorError(f"number out of range: {text[:40]}", token.column)
            return Literal(value)
        return Literal(int(text))

    def true(self, _token: Token) -> Literal:
        return Literal(True)

    def false(self, _token: Token) -> Literal:
        return Literal(False)

    def compare(self, left: Expr, op: Token, right: Expr) -> Compare:
        return Compare(str(op), left, right)

    def arithmetic(self, left: Expr, op: Token, right: Expr) -> Arithmetic:
        return Arithmetic(str(op), left, right)

    def sign(self, op: Token, operand: Expr) -> Expr:
        if str(op) == "+":
            return operand
        if isinstance(operand, Literal) and _is_number(operand.value):
            return Literal(-operand.value)  # type: ignore[operator]
        return Negate(operand)

    def or_expr(self, *operands: Expr) -> Logical:
        return Logical("or", operands)

    def and_expr(self, *operands: Expr) -> Logical:
        return Logical("and", operands)

    def not_(self, _not: Token, operand: Expr) -> Not:
        return Not(operand)

    def between(self, operand: Expr, negated: Token | None, low: Expr, high: Expr) -> Between:
        return Between(operand, low, high, negated is not None)

    def in_(self, operand: Expr, negated: Token | None, *values: Literal) -> In:
        return In(operand, tuple(v.value for v in values), negated is not None)

    def like(
        self, operand: Expr, negated: Token | None, pattern: Literal, escape: Literal | None
    ) -> Like:
        escape_char = None
        if escape is not None:
            escape_char = str(escape.value)
            if len(escape_char) != 1:
                raise SelectorError("the ESCAPE of LIKE must be one character")
        return Like(operand, str(pattern.value), escape_char, negated is not None)

    def is_null(self, operand: Expr, negated: Token | None) -> IsNull:
        return IsNull(operand, negated is not None)

    def call(self, name: Token, *_args: Any) -> Expr:
        raise SelectorError(f"unknown function: {str(name)[:60]}", name.column)


@functools.cache
def _parser() -> Lark:
    grammar = resources.files(__package__).joinpath("selector.lark").read_text()
    return Lark(grammar, parser="lalr", lexer="basic", maybe_placeholders=True)


def parse_selector(text: str) -> Expr:
    """The tree of a selector; raises :class:`SelectorError` saying what and where."""
    if not isinstance(text, str):
        raise SelectorError("a selector is a string")
    if len(text) > MAX_SELECTOR_CHARS:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_CHARS} characters")
    if not text.strip():
        raise SelectorError("the selector is empty")
    _check_parentheses(text)
    try:
        tree = _parser().parse(text)
    except UnexpectedEOF:
        raise SelectorError("the selector ends too early", len(text) + 1) from None
    except UnexpectedCharacters as exc:
        char = text[exc.pos_in_stream or 0]
        raise SelectorError(f"unexpected character {char!r}", exc.column) from None
    except UnexpectedInput as exc:
        token = getattr(exc, "token", None)
        if token is None or token.type == "$END":
            raise SelectorError("the selector ends too early", len(text) + 1) from None
        raise SelectorError(f"unexpected {str(token)[:40]!r}", exc.column) from None
    _check_depth(tree)
    try:
        result = _ToTree().transform(tree)
    except VisitError as exc:
        if isinstance(exc.orig_exc, SelectorError):
            raise exc.orig_exc from None
        raise
    assert not isinstance(result, Tree | Token)
    return result


def _check_parentheses(text: str) -> None:
    """Refuse deep parentheses before parsing, outside string literals."""
    depth = 0
    quoted = False
    for column, char in enumerate(text, 1):
        if char == "'":
            quoted = not quoted
        elif quoted:
            continue
        elif char == "(":
            depth += 1
            if depth > MAX_DEPTH:
                raise SelectorError(f"nested deeper than {MAX_DEPTH} levels", column)
        elif char == ")":
            depth -= 1


def _check_depth(tree: Tree[Token]) -> None:
    """Refuse a tree deeper than :data:`MAX_DEPTH` (chains of NOT or signs), without
    recursion."""
    stack: list[tuple[Tree[Token], int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_DEPTH:
            column = getattr(node.meta, "column", None) if not node.meta.empty else None
            raise SelectorError(f"nested deeper than {MAX_DEPTH} levels", column)
        stack.extend((child, depth + 1) for child in node.children if isinstance(child, Tree))


# -- compiling -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selector:
    """A compiled selector: ``matches(notification)``, and the event types it can match."""

    text: str
    matches: Predicate
    #: Every event type a matching notification can have; None when any can match.
    event_types: frozenset[str] | None
    #: ``matches`` without the tests of the event type, for notifications read by the pinned
    #: types (those tests are TRUE for each of them).
    matches_of_pinned: Predicate


@functools.lru_cache(maxsize=1024)
def compile_selector(text: str) -> Selector:
    """Parse and compile once; equal selectors share the result."""
    expr = parse_selector(text)
    _check_name_comparisons(expr)
    pinned = pinned_types(expr)
    matches = _predicate(expr)
    if pinned is None:
        return Selector(text, matches, None, matches)
    rest = _without_type_tests(expr)
    return Selector(text, matches, pinned, _predicate(rest) if rest is not None else _always)


def _children(expr: Expr) -> tuple[Expr, ...]:
    if isinstance(expr, (Compare, Arithmetic)):
        return (expr.left, expr.right)
    if isinstance(expr, Logical):
        return expr.operands
    if isinstance(expr, Between):
        return (expr.operand, expr.low, expr.high)
    if isinstance(expr, (Negate, Not, In, Like, IsNull)):
        return (expr.operand,)
    return ()


def _nodes(expr: Expr) -> list[Expr]:
    """Every node of the tree."""
    found: list[Expr] = []
    todo = [expr]
    while todo:
        node = todo.pop()
        found.append(node)
        todo.extend(_children(node))
    return found


#: The attributes whose values are names (an event type, a stream), never a data field's.
_NAMED: Final = {EVENT_TYPE: "an event type", STREAM: "a stream name"}


def _check_name_comparisons(expr: Expr) -> None:
    """``eventType = ORDER_PLACED`` (or ``stream = orders``) compares a name with an attribute
    no event has, which is NULL for every event: refused, saying to quote the name."""
    for node in _nodes(expr):
        if not isinstance(node, Compare):
            continue
        for side, other in ((node.left, node.right), (node.right, node.left)):
            if (
                isinstance(side, Identifier)
                and side.name in _NAMED
                and isinstance(other, Identifier)
                and other.name not in BASE_ATTRIBUTES
            ):
                name = other.name[:60]
                raise SelectorError(
                    f"{name} is not an attribute of every event ({', '.join(BASE_ATTRIBUTES)}):"
                    f" quote {_NAMED[side.name]}, {side.name} {node.op} '{name}'"
                )


def _predicate(expr: Expr) -> Predicate:
    evaluate = _compile(expr)
    if isinstance(expr, _TRUTH_VALUED):
        # TRUE, FALSE or NULL (None) only: its truth is the match, with no wrapper call.
        return evaluate  # type: ignore[return-value]

    def matches(notification: Notification) -> bool:
        return evaluate(notification) is True

    return matches


def _always(_notification: Notification) -> bool:
    return True


def _without_type_tests(expr: Expr) -> Expr | None:
    """``expr`` less the conjuncts that only test the event type (None: nothing is left)."""
    if _is_type_test(expr):
        return None
    if isinstance(expr, Logical) and expr.op == "and":
        rest = tuple(o for o in expr.operands if not _is_type_test(o))
        return rest[0] if len(rest) == 1 else Logical("and", rest)
    return expr


def _is_type_test(expr: Expr) -> bool:
    """A test of the event type alone, which the pinned types make TRUE."""
    if isinstance(expr, Logical):
        return all(_is_type_test(o) for o in expr.operands)
    return pinned_types(expr) is not None


#: Nodes whose value is always TRUE, FALSE or NULL.
_TRUTH_VALUED: Final = (Compare, Logical, Not, Between, In, Like, IsNull)


def pinned_types(expr: Expr) -> frozenset[str] | None:
    """The event types ``expr`` can be TRUE for, when it pins them (``eventType = 'X'``,
    ``eventType IN (...)``, and AND/OR of those); None otherwise."""
    if isinstance(expr, Compare) and expr.op == "=":
        for side, other in ((expr.left, expr.right), (expr.right, expr.left)):
            if (
                isinstance(side, Identifier)
                and side.name == EVENT_TYPE
                and isinstance(other, Literal)
            ):
                value = other.value
                return frozenset([value] if isinstance(value, str) else [])
        return None
    if isinstance(expr, In) and not expr.negated:
        if isinstance(expr.operand, Identifier) and expr.operand.name == EVENT_TYPE:
            return frozenset(v for v in expr.values if isinstance(v, str))
        return None
    if isinstance(expr, Logical):
        parts = [pinned_types(operand) for operand in expr.operands]
        if expr.op == "and":
            known = [p for p in parts if p is not None]
            return functools.reduce(frozenset.intersection, known) if known else None
        if any(p is None for p in parts):
            return None
        return frozenset().union(*(p for p in parts if p is not None))
    return None


def _is_number(value: Value) -> bool:
    return type(value) in (int, float)


def compare_values(op: str, left: Value, right: Value) -> bool | None:
    """``left op right`` in three-valued logic; None (NULL) when they do not compare."""
    if left is None or right is None:
        return None
    kind, other = type(left), type(right)
    if kind is not other:
        if kind not in (int, float) or other not in (int, float):
            return None
    elif kind is bool and op not in ("=", "<>"):
        return None
    return COMPARISONS[op](left, right)


def _arithmetic(op: str, left: Value, right: Value) -> Value:
    if not _is_number(left) or not _is_number(right):
        return None
    a: Any = left
    b: Any = right
    if op == "+":
        return a + b  # type: ignore[no-any-return]
    if op == "-":
        return a - b  # type: ignore[no-any-return]
    if op == "*":
        return a * b  # type: ignore[no-any-return]
    if b == 0:
        return None
    if type(a) is int and type(b) is int:
        quotient = abs(a) // abs(b)
        return -quotient if (a < 0) != (b < 0) else quotient
    return a / b  # type: ignore[no-any-return]


def _compile(expr: Expr) -> _Eval:
    if isinstance(expr, Identifier):
        return getter(expr.name)
    if isinstance(expr, Literal):
        value = expr.value
        return lambda _n: value
    if isinstance(expr, Compare):
        return _compile_compare(expr)
    if isinstance(expr, Arithmetic):
        left, right, op = _compile(expr.left), _compile(expr.right), expr.op
        return lambda n: _arithmetic(op, left(n), right(n))
    if isinstance(expr, Negate):
        operand = _compile(expr.operand)
        return lambda n: _arithmetic("-", 0, operand(n))
    if isinstance(expr, Logical):
        return _compile_logical(expr.op, [_compile(o) for o in expr.operands])
    if isinstance(expr, Not):
        inner = _compile(expr.operand)

        def negation(n: Notification) -> Value:
            value = inner(n)
            return not value if type(value) is bool else None

        return negation
    if isinstance(expr, Between):
        return _compile_between(expr)
    if isinstance(expr, In):
        return _compile_in(expr)
    if isinstance(expr, Like):
        return _compile_like(expr)
    return _compile_is_null(expr)


def _compile_compare(expr: Compare) -> _Eval:
    op, left_expr, right_expr = expr.op, expr.left, expr.right
    if isinstance(left_expr, Literal) and not isinstance(right_expr, Literal):
        op, left_expr, right_expr = FLIPPED[op], right_expr, left_expr
    left = _compile(left_expr)
    if isinstance(right_expr, Literal):
        # The usual case, an attribute against a constant: the constant's kind is known.
        constant = right_expr.value
        compare = COMPARISONS[op]
        if constant is None:
            return lambda _n: None
        if isinstance(left_expr, Identifier):
            fused = _field_against_constant(left_expr.name, op, constant)
            if fused is not None:
                return fused
        if _is_number(constant):

            def with_number(n: Notification) -> Value:
                value = left(n)
                if type(value) in (int, float):
                    return compare(value, constant)
                return None

            return with_number
        if type(constant) is bool and op not in ("=", "<>"):
            return lambda _n: None
        kind = type(constant)

        def with_constant(n: Notification) -> Value:
            value = left(n)
            return compare(value, constant) if type(value) is kind else None

        return with_constant
    right = _compile(right_expr)
    return lambda n: compare_values(op, left(n), right(n))


def _field_against_constant(name: str, op: str, constant: Value) -> _Eval | None:
    """The commonest comparisons as one closure each (no getter call): the event type, or a
    top-level data field, against a constant."""
    compare = COMPARISONS[op]
    if name == EVENT_TYPE and type(constant) is str:
        if op == "=":
            return lambda n: n.type == constant
        return lambda n: compare(n.type, constant)
    if "." in name or name in BASE_ATTRIBUTES:
        return None
    if _is_number(constant):

        def field_with_number(n: Notification) -> Value:
            data = n.data
            if type(data) is dict:
                value = data.get(name)
                if type(value) is int or type(value) is float:
                    return compare(value, constant)
            return None

        return field_with_number
    if type(constant) is bool and op not in ("=", "<>"):
        return None
    kind = type(constant)

    def field_with_constant(n: Notification) -> Value:
        data = n.data
        if type(data) is dict:
            value = data.get(name)
            if type(value) is kind:
                return compare(value, constant)
        return None

    return field_with_constant


def _compile_logical(op: str, operands: Sequence[_Eval]) -> _Eval:
    if len(operands) <= 4:  # three-valued AND and OR associate: fold into pairs
        pair = _both if op == "and" else _either
        return functools.reduce(pair, operands)
    stop = op != "and"  # AND stops at FALSE, OR at TRUE

    def logical(n: Notification) -> Value:
        unknown = False
        for operand in operands:
            value = operand(n)
            if value is stop:
                return stop
            if type(value) is not bool:
                unknown = True
        return None if unknown else not stop

    return logical


def _both(first: _Eval, second: _Eval) -> _Eval:
    def both(n: Notification) -> Value:
        a = first(n)
        if a is False:
            return False
        b = second(n)
        if b is False:
            return False
        return True if a is True and b is True else None

    return both


def _either(first: _Eval, second: _Eval) -> _Eval:
    def either(n: Notification) -> Value:
        a = first(n)
        if a is True:
            return True
        b = second(n)
        if b is True:
            return True
        return False if a is False and b is False else None

    return either


def _compile_between(expr: Between) -> _Eval:
    operand, low, high = _compile(expr.operand), _compile(expr.low), _compile(expr.high)
    negated = expr.negated

    def between(n: Notification) -> Value:
        value = operand(n)
        above = compare_values(">=", value, low(n))
        below = compare_values("<=", value, high(n))
        if above is False or below is False:
            result: bool | None = False
        elif above is None or below is None:
            result = None
        else:
            result = True
        return (not result) if negated and result is not None else result

    return between


def _compile_in(expr: In) -> _Eval:
    operand = _compile(expr.operand)
    items = expr.values
    negated = expr.negated
    by_kind: dict[type, frozenset[Value]] = {}
    for kind in (str, bool):
        by_kind[kind] = frozenset(v for v in items if type(v) is kind)
    numbers = frozenset(v for v in items if _is_number(v))
    by_kind[int] = by_kind[float] = numbers

    def membership(n: Notification) -> Value:
        value = operand(n)
        if value is None:
            return None
        same = by_kind[type(value)]
        if value in same:
            return not negated
        if len(same) < len(items):  # some items do not compare with the value: NULL
            return None
        return negated

    return membership


def like_pattern(pattern: str, escape: str | None) -> re.Pattern[str]:
    """``LIKE`` as a regular expression: ``%`` any run, ``_`` any one character, and the
    escape character makes the next one literal."""
    parts: list[str] = []
    chars = iter(pattern)
    for char in chars:
        if escape is not None and char == escape:
            following = next(chars, None)
            if following is None:
                raise SelectorError("LIKE pattern ends with its escape character")
            parts.append(re.escape(following))
        elif char == "%":
            parts.append(".*")
        elif char == "_":
            parts.append(".")
        else:
            parts.append(re.escape(char))
    return re.compile("".join(parts), re.DOTALL)


def _compile_like(expr: Like) -> _Eval:
    operand = _compile(expr.operand)
    fullmatch = like_pattern(expr.pattern, expr.escape).fullmatch
    negated = expr.negated

    def like(n: Notification) -> Value:
        value = operand(n)
        if type(value) is not str:
            return None
        return (fullmatch(value) is None) is negated

    return like


def _compile_is_null(expr: IsNull) -> _Eval:
    operand = _compile(expr.operand)
    if expr.negated:
        return lambda n: operand(n) is not None
    return lambda n: operand(n) is None
