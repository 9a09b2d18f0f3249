"""Command line: `tensorplan transcribe | plan | pack | export | serve | live`.

Each subcommand lives in tensorplan/commands/<name>.py with `register(subparsers)`, which
adds its parser and sets `func(args) -> int`. A UserError prints one line and exits 2;
--debug (anywhere on the line, or TENSORPLAN_DEBUG=1) shows the traceback instead.

openai-whisper's spellings work too (`openai_spellings`): `--output_dir` for every
`--output-dir`, and `--verbose False` for `--no-verbose`.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any, NoReturn

from tensorplan.errors import Terminated, UserError, one_line

COMMANDS = ("transcribe", "plan", "pack", "export", "serve", "live", "wyoming")
_BOOL_WORDS = {"true": True, "false": False}  # openai's str2bool, also in lower case


class _Parser(argparse.ArgumentParser):
    """argparse's, with its errors on one line like every other bad input's (argparse
    printed its usage block first), and where to read the flags."""

    def error(self, message: str) -> NoReturn:
        from tensorplan.errors import one_line

        self.exit(2, f"tensorplan: error: {one_line(message)} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="tensorplan",
        description="Whisper speech to text on a tensor-graph runtime with a static memory "
        "planner.",
    )
    parser.add_argument("--version", action=_Version, help="show the version and exit")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and debug logs")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"tensorplan.commands.{name}").register(sub)
    for command in sub.choices.values():  # SUPPRESS: absent here keeps the top level's value
        command.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                             help="show tracebacks and debug logs")
    return parser


class _Version(argparse.Action):
    """--version, looked up only when asked for: importlib.metadata costs 35 ms of import
    (email, zipfile, ...) that every other run would pay while the parser is built."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        print(f"{parser.prog} {version()}")  # to stdout, as argparse's "version" action
        parser.exit()


def version() -> str:
    """The installed distribution's version; the source tree's when run uninstalled."""
    import importlib.metadata

    try:
        return importlib.metadata.version("tensorplan")
    except importlib.metadata.PackageNotFoundError:
        from tensorplan import __version__

        return __version__


def openai_spellings(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """`argv` with openai-whisper's spellings rewritten to this parser's, before parsing.

    `--foo_bar` becomes `--foo-bar` when that is (the start of) an option of the command
    being parsed, so every flag of every subcommand has its underscore alias without a list
    of aliases. A boolean flag followed by True or False (`--verbose False`,
    `--word_timestamps=True`) becomes `--verbose` / `--no-verbose`. Nothing after `--`
    changes.
    """
    options, commands = _options(parser), _subcommands(parser)
    in_command = False
    out: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        i += 1
        if arg == "--":
            out += argv[i - 1 :]
            break
        if not arg.startswith("--"):
            if not in_command and arg in commands:
                options, in_command = _options(commands[arg]), True
            out.append(arg)
            continue
        name, eq, value = arg.partition("=")
        dashed = name.replace("_", "-")
        if dashed != name and any(o.startswith(dashed) for o in options):
            name = dashed
        action = options.get(name)
        word = value if eq else argv[i] if i < len(argv) else ""
        if _is_switch(action, name) and word.lower() in _BOOL_WORDS:
            i += 0 if eq else 1
            out += _switch(name, action, _BOOL_WORDS[word.lower()])
            continue
        out.append(name + eq + value)
    return out


def _options(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {s: a for a in parser._actions for s in a.option_strings}


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _is_switch(action: argparse.Action | None, name: str) -> bool:
    """An on/off flag spelled in its positive form (`--verbose`, not `--no-verbose`)."""
    if isinstance(action, argparse.BooleanOptionalAction):
        return not name.startswith("--no-")
    return isinstance(action, argparse._StoreTrueAction)


def _switch(name: str, action: argparse.Action | None, on: bool) -> list[str]:
    if on:
        return [name]
    if isinstance(action, argparse.BooleanOptionalAction):
        return ["--no-" + name[2:]]
    return []  # a store_true flag set to False: as if absent


def entry() -> NoReturn:
    """The `tensorplan` program (and `python -m tensorplan`): main(), then exit.

    The objects still alive are frozen first, out of the reach of the garbage collection
    the interpreter runs as it shuts down: that collection walked every graph, plan and
    tokenizer table for nothing, 82 ms of jfk.wav's exit against 24 ms frozen (median of
    8). atexit handlers and refcount frees still run; only cycles go uncollected, and the
    process is ending. In-process callers use main(), which freezes nothing."""
    code = main(program=True)
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str] | None = None, program: bool = False) -> int:
    """The CLI on `argv` (None: sys.argv), with SIGTERM raising Terminated. Once an
    interrupt or SIGTERM has decided the exit code, later Ctrl-Cs are ignored: one landing
    while the program was on its way out (an atexit join, the last bytecodes of entry)
    turned exit 130 into death by SIGINT (-2) in a loaded test run. In-process callers
    (program False: tests) get their handlers back."""
    previous = _stop_on_sigterm()
    previous_int = signal.getsignal(signal.SIGINT) if previous is not None else None
    try:
        return _main(argv)
    finally:
        if previous is not None and not program:
            signal.signal(signal.SIGTERM, previous)
            signal.signal(signal.SIGINT, previous_int)


def _main(argv: Sequence[str] | None) -> int:
    try:
        parser = build_parser()
        args = parser.parse_args(openai_spellings(parser, sys.argv[1:] if argv is None else argv))
    except KeyboardInterrupt:  # while importing or parsing: still no traceback
        _ignore_interrupts()
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
        _ignore_interrupts()
        print("tensorplan: terminated (SIGTERM); finished outputs are kept", file=sys.stderr)
        return 128 + signal.SIGTERM
    except KeyboardInterrupt:
        _ignore_interrupts()
        print("tensorplan: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0


def _ignore_interrupts() -> None:
    """Ctrl-C ignored from here on (main thread only): the exit code is decided."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


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
