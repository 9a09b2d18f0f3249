"""Errors caused by the user's input: the CLI prints them as one line and exits 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (a file, a flag, a trace): the message names the thing and the problem."""


class ModelError(UserError):
    """A model directory or weight file that cannot be used."""


class AudioError(UserError):
    """An audio input that cannot be decoded."""


class TraceError(UserError):
    """A malformed lifetime trace for `tensorplan pack`."""
