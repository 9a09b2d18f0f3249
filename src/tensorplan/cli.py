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
import sys
from collections.abc import Sequence

from tensorplan.errors import UserError

COMMANDS = ("transcribe", "plan", "pack", "export", "bench", "serve")


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
        print(f"tensorplan: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tensorplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
