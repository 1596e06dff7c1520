"""The ``futoin-evt`` command line, a module per command group. The only package that reads
argv and the environment."""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from collections.abc import Sequence

from .. import __version__, build
from ..storage.errors import StoreError
from . import calls, check, consumer, grants, sas, schema, serve, stream, user
from .common import CliError, Parser, configure_logging, event_loop_factory


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_level, args.log_format)
    if args.log_level != "debug":
        logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        with asyncio.Runner(loop_factory=event_loop_factory()) as runner:
            return int(runner.run(args.run(args)) or 0)
    except CliError as exc:
        print(f"futoin-evt: {exc}", file=sys.stderr)
        return exc.exit_status
    except StoreError as exc:  # the database cannot be opened or has a newer schema
        print(f"futoin-evt: {str(exc).rstrip('.')}.", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = Parser(prog="futoin-evt", description="FutoIn FTN18 event stream server and tools.")
    parser.add_argument(
        "--version", action="version", version=f"futoin-evt {__version__} ({build()})"
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="log lines on stderr from this level on",
    )
    parser.add_argument(
        "--log-format",
        default="text",
        choices=["text", "json"],
        help="json: one JSON object per line (time, level, logger, message, peer, user, door)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve.add_commands(commands)
    user.add_commands(commands)
    grants.add_commands(commands)
    sas.add_commands(commands)
    calls.add_commands(commands)
    consumer.add_commands(commands)
    stream.add_commands(commands)
    schema.add_commands(commands)
    check.add_commands(commands)
    return parser
