"""Errors caused by the user's input: the CLI prints them as one line and exits 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (a file, a flag, a trace): the message names the thing and the problem."""


class ModelError(UserError):
    """A model directory or weight file that cannot be used."""


class AudioError(UserError):
    """An audio input that cannot be decoded."""


class AudioTooLongError(AudioError):
    """Audio longer than the caller allows (a server's --max-audio-seconds)."""


class TraceError(UserError):
    """A malformed lifetime trace for `tensorplan pack`."""


def one_line(message: str) -> str:
    """`message` as one printable line: a newline or control character (from a file name,
    say) is escaped, so an error can neither split nor forge lines."""
    if message.isprintable():
        return message
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in message)


class Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt so that it stops a run as Ctrl-C does: `finally`
    blocks run (the batch manifest is saved, workers are stopped) and one line is printed."""
