"""Command line: `tensorplan transcribe | plan | pack | bench`.

Each subcommand lives in tensorplan/commands/<name>.py with `register(subparsers)`, which
adds its parser and sets `func(args) -> int`. A UserError prints one line and exits 2;
--debug (or TENSORPLAN_DEBUG=1) shows the traceback instead.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from tensorplan.errors import Terminated, UserError, one_line

COMMANDS = ("transcribe", "plan", "pack", "export", "bench")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tensorplan", description=__doc__.splitlines()[0])
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"tensorplan.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"tensorplan.commands.{name}":
                raise
            continue  # a subcommand not built yet
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    previous = _stop_on_sigterm()
    try:
        return _main(argv)
    finally:
        if previous is not None:  # in-process callers (tests) get their handler back
            signal.signal(signal.SIGTERM, previous)


def _main(argv: Sequence[str] | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(argv)
    except KeyboardInterrupt:  # while importing or parsing: still no traceback
        print("tensorplan: interrupted", file=sys.stderr)
        return 130
    debug = args.debug or os.environ.get("TENSORPLAN_DEBUG", "0") not in ("", "0")
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except UserError as e:
        if debug:
            raise
        print(f"tensorplan: error: {one_line(str(e))}", file=sys.stderr)
        return 2
    except Terminated:
        print("tensorplan: terminated (SIGTERM); finished outputs are kept", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        print("tensorplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _stop_on_sigterm() -> Any:
    """SIGTERM raises Terminated in the main thread (see errors.Terminated); returns the
    handler it replaced (None off the main thread, where none can be set)."""
    def handler(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not interrupt
        raise Terminated()  # the cleanup the first one started

    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGTERM, handler)


if __name__ == "__main__":
    sys.exit(main())
