"""How the tests are laid out: what several test files share lives in tests/support (or, as
fixtures, in tests/conftest.py), never in another test file; waits on a deadline are
tests/support/waiting.py's."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

TESTS = Path(__file__).resolve().parent
#: Packages of tests/ that are tools of their own (the power-loss filesystem, the test hosts
#: in network namespaces): the fault benchmarks import them too.
TOOLS = {"faultfs", "nethosts"}
#: What a test file may import from tests/ (besides tests/support).
SHARED = {"conftest", *TOOLS}


def files_of_tests() -> list[Path]:
    return sorted(TESTS.glob("test_*.py"))


def imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, what) for each import of ``path`` from the tests package, as the name of a
    module directly under tests/ (``support`` for tests/support/...)."""
    package = "tests" if path.parent == TESTS else f"tests.{path.parent.name}"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            # ``from tests import x`` and ``from . import x`` name modules
            modules = [f"{base}.{a.name}" for a in node.names] if base == "tests" else [base]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "tests" and len(parts) > 1:
                yield node.lineno, parts[1]


def test_no_test_file_imports_another_or_a_helper_outside_support() -> None:
    wrong = [
        f"{path.name}:{line} imports tests.{name}"
        for path in files_of_tests()
        for line, name in imported(path)
        if name != "support" and name not in SHARED
    ]
    assert wrong == []


def test_support_stands_below_the_tests() -> None:
    """tests/support imports neither test files nor conftest (which imports it)."""
    wrong = [
        f"support/{path.name}:{line} imports tests.{name}"
        for path in sorted((TESTS / "support").glob("*.py"))
        for line, name in imported(path)
        if name != "support" and name not in TOOLS
    ]
    assert wrong == []


def calls_monotonic(node: ast.AST) -> bool:
    return any(
        isinstance(sub, ast.Call)
        and isinstance(sub.func, ast.Attribute)
        and sub.func.attr == "monotonic"
        for sub in ast.walk(node)
    )


def test_deadline_loops_are_the_waiting_helpers() -> None:
    """No loop of a test file (or conftest) watches the clock itself: ``until``,
    ``until_blocking`` and ``Deadline`` of tests/support/waiting.py do."""
    files = [*files_of_tests(), TESTS / "conftest.py"]
    files += [p for p in (TESTS / "support").glob("*.py") if p.name != "waiting.py"]
    wrong = [
        f"{path.relative_to(TESTS)}:{node.lineno}"
        for path in sorted(files)
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.While | ast.For | ast.AsyncFor) and calls_monotonic(node)
    ]
    assert wrong == []
