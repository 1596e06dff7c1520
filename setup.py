"""The build: the modules on the hot paths compiled with mypyc from the same typed source.

``pip install .`` compiles :data:`COMPILED` when mypyc (a build requirement), a C compiler
and the Python headers are there, and installs the pure-Python package otherwise, with one
line saying why. ``FUTOIN_EVT_PURE=1`` asks for the pure-Python package; an editable install
(``pip install -e .``) is always pure Python. ``futoin-evt --version`` says which was built.
The metadata is in setup.cfg.
"""

from __future__ import annotations

import os
import shutil
import sys
import sysconfig
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

#: Compiled with mypyc; what each group paid in server CPU per call, both servers in one run
#: (``python -m bench.compare --installed``, see the commits). Left pure: the AMQP engine's
#: connection, sessions and performatives (decorated), storage/sqlite/ but its commit, and
#: pages.py (classes that interpreted backends and mixins inherit).
COMPILED = [
    # FTN3 envelope and iface checks, the executor; with the next group, addEvent against
    # pure Python: 1 at a time 0.76x, 32 in flight 0.80x, 8 connections x 4 0.67x
    "futoin_evt/ftn3/messages.py",
    "futoin_evt/ftn3/ifaces.py",
    "futoin_evt/server/executor.py",
    # WebSocket framing and listener, the FTN18 services, the checksum check, against the
    # group above alone: addEvent 1 at a time 0.84x, 32 in flight 0.94x, 8 connections x 4 0.89x
    "futoin_evt/wsio.py",
    "futoin_evt/server/websocket.py",
    "futoin_evt/ftn18/services.py",
    "futoin_evt/storage/checksums.py",
    # the page code's work per event: poll drain 0.86x, push catch-up 0.93x (against pure)
    "futoin_evt/storage/page_rows.py",
    # the rest of an append's way down and its accounting: the event log, the metrics,
    # the recent events' cache, the credential cache, the connection slots; with the loop
    # kept where each call made a future and event types matched once, against the groups
    # above: server CPU per addEvent at normal 0.85x (1 at a time), 0.94x (32 in flight),
    # 0.96x (8 connections x 4)
    "futoin_evt/log/eventlog.py",
    "futoin_evt/stats.py",
    "futoin_evt/storage/recent.py",
    "futoin_evt/auth/users.py",
    "futoin_evt/slots.py",
    # the Kafka door's record batches, per call against pure Python (timeit, best of 5):
    # decoding a Produce batch of 100 records of 100 bytes 0.28x (36 against 127 us; with lz4
    # 42 against 128 us), encoding a Fetch batch of 500 records 0.36x (74 against 207 us)
    "futoin_evt/kafka/records.py",
    # SQLite's commit (the writes of a group commit, their runs and keys; the writer's class
    # stays interpreted): CPU per event of 32 appends a commit in one process, against this
    # module pure, three turns each: 6.66-7.92 against 7.63-8.47 us
    "futoin_evt/storage/sqlite/transaction.py",
    # the AMQP door's codec (the marker types stay interpreted in amqp/engine/markers.py):
    # encoding a new event's message per call against pure Python (timeit, best of 5, one
    # sitting), body as amqp-value 0.69x (2.6 against 3.75 us), as a data section 0.65x
    # (0.85-0.93 against 1.31-1.38 us); decoding a produced message 0.59x (7.9 against 13.4
    # us); server CPU per consumed message (rhea) within the noise: 8.3-9.0 against 8.7-10.0
    "futoin_evt/amqp/codec.py",
    "futoin_evt/amqp/engine/types.py",
    "futoin_evt/amqp/engine/message.py",
    "futoin_evt/amqp/engine/transfers.py",
    # the DCB request model's parsing and checks, per call against pure Python (process CPU,
    # best of 7 x 20,000): an append's event and condition 0.78x (4.3 against 5.5 us), a
    # read's query 0.74x (1.6 against 2.1 us); the checks of domain/dcb.py stay interpreted
    "futoin_evt/dcb/model.py",
]

#: mypy as mypyc runs it: not the project's --strict configuration (mypy checks that), and the
#: optional packages (extras) need not be installed; what the compiled modules import from
#: other packages is a build requirement (pyproject.toml), so the build is the same anywhere.
_MYPY = ["--config-file=", "--ignore-missing-imports", "--follow-imports=silent"]

#: The commands that build a wheel or install; the metadata steps compile nothing.
_BUILDS = {"bdist_wheel", "build", "build_ext", "install"}


def _say(line: str) -> None:
    print(f"futoin-evt: {line}", file=sys.stderr, flush=True)


def _pure_because() -> str | None:
    """Why this build is pure Python, or None when it compiles."""
    if os.environ.get("FUTOIN_EVT_PURE", "") not in ("", "0"):
        return "FUTOIN_EVT_PURE is set"
    compiler = (os.environ.get("CC") or sysconfig.get_config_var("CC") or "").split()
    if not compiler or shutil.which(compiler[0]) is None:
        return f"no C compiler ({' '.join(compiler) or 'none configured'})"
    include = sysconfig.get_paths()["include"]
    if not Path(include, "Python.h").is_file():
        return f"the Python headers are missing ({include}/Python.h)"
    try:
        import mypyc.build  # noqa: F401
    except ImportError:
        return "mypyc is not installed"
    return None


def _extensions() -> list[Extension]:
    if not _BUILDS & set(sys.argv[1:]):
        return []
    because = _pure_because()
    if because is None:
        from mypyc.build import mypycify

        try:
            return mypycify([*_MYPY, *COMPILED], opt_level="3")
        except (Exception, SystemExit) as error:  # mypyc exits on a type error
            because = f"mypyc failed ({error})"
    _say(f"installing the pure-Python package: {because}")
    return []


class BuildExt(build_ext):
    """Compiles the extensions; when the C compiler fails, leaves them out and says so (the
    pure-Python modules are installed in any case)."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:
            kind = type(error).__name__  # its message is the whole command line
            _say(f"installing the pure-Python package: compiling failed ({kind}; see above)")
            for extension in self.extensions:  # none without the others
                Path(self.get_ext_fullpath(extension.name)).unlink(missing_ok=True)
            self.extensions = []

    def get_outputs(self) -> list[str]:
        return super().get_outputs() if self.extensions else []


def _options() -> dict[str, Any]:
    extensions = _extensions()
    if not extensions:
        return {}
    return {"ext_modules": extensions, "cmdclass": {"build_ext": BuildExt}}


setup(**_options())
