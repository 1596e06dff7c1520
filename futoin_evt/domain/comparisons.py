"""The comparison operators that selectors and SQL filters share (``=``, ``<>``, ``<``,
``<=``, ``>``, ``>=``): what each computes, and each as it reads with its operands swapped."""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Final

COMPARISONS: Final[dict[str, Callable[[Any, Any], bool]]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
#: ``a op b`` is ``b FLIPPED[op] a``.
FLIPPED: Final = {"=": "=", "<>": "<>", "<": ">", "<=": ">=", ">": "<", ">=": "<="}
