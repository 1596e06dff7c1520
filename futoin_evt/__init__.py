"""futoin-evt: the FutoIn FTN18 event stream over FTN3 JSON messages on WebSocket."""

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

__version__ = "0.1.0"

_EXTENSIONS = tuple(EXTENSION_SUFFIXES)


def build() -> str:
    """Which build is installed: the modules compiled with mypyc (setup.py), or none."""
    package = Path(__file__).parent
    compiled = [path for path in package.rglob("*") if path.name.endswith(_EXTENSIONS)]
    if not compiled:
        return "pure Python"
    return f"compiled with mypyc: {len(compiled)} modules"
