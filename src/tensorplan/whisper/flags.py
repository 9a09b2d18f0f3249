"""CLI flags generated from option dataclasses, and read back: the one flag generator.

A field declared with `option(default, help, group=...)` carries its help text; `add_arguments`
adds one flag per field (kebab-case: `--beam-size`), `from_args` builds the dataclass from
parsed flags and `to_argv` spells a dataclass back as flags. TranscribeOptions and
DecodingOptions (options.py) and ModelOptions (planned/load_options.py) are declared this way.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any, Literal, TypeVar, Union

from tensorplan.errors import UserError


def option(default: Any, help: str, **cli: Any) -> Any:
    """A dataclass field with its CLI help text (and optional extra keys, such as the
    `group` of its flag: "everyday" for those `transcribe --help` lists first)."""
    return field(default=default, metadata={"help": help, **cli})


OptionsT = TypeVar("OptionsT")


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def add_arguments(parser: argparse.ArgumentParser | argparse._ArgumentGroup,
                  cls: type[Any], exclude: Sequence[str] = (),
                  group: str | None = None, only: Sequence[str] | None = None) -> None:
    """Add one flag per field of `cls` (a dataclass) to `parser`; with `group`, only the
    fields whose metadata names that group ("decoding" when it names none); with `only`,
    only the fields named.

    bool fields become `--x/--no-x`; `X | None` fields also accept "none"; tuples read a
    comma-separated list; Literal fields get choices. The parsed value lands in
    `args.<field name>` and defaults to the field's default.
    """
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in exclude or group not in (None, f.metadata.get("group", "decoding")):
            continue
        if only is not None and f.name not in only:
            continue
        shown = _format(f.default).replace("%", "%%") or '""'
        kwargs: dict[str, Any] = {"dest": f.name, "default": f.default,
                                  "help": f"{f.metadata['help']} (default: {shown})"}
        kind, optional = _strip_none(hints[f.name])
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            parse, choices = _parser_for(kind)
            kwargs["type"] = _or_none(parse) if optional else parse
            kwargs["metavar"] = _metavar(kind, choices)
            if choices:
                kwargs["choices"] = list(choices) + ([None] if optional else [])
        parser.add_argument(flag_name(f.name), **kwargs)


def from_args(cls: type[OptionsT], args: argparse.Namespace) -> OptionsT:
    """Build `cls` from parsed flags; fields without a flag keep their default.
    Inconsistent flags raise UserError."""
    names = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
    values = {name: getattr(args, name) for name in names if hasattr(args, name)}
    try:
        return cls(**values)
    except ValueError as e:  # messages open with the field's name: say the flag instead
        first, _, rest = str(e).partition(" ")
        field_name = first.rstrip(":")
        if field_name in names:
            first = flag_name(field_name) + first[len(field_name):]
        raise UserError(f"{first} {rest}") from None


def to_argv(options: Any) -> list[str]:
    """The flags that parse back to `options` (those that differ from the defaults)."""
    argv: list[str] = []
    for f in dataclasses.fields(options):
        value = getattr(options, f.name)
        if value == f.default:
            continue
        if isinstance(value, bool):
            argv.append(flag_name(f.name) if value else "--no-" + flag_name(f.name)[2:])
        else:
            argv.append(f"{flag_name(f.name)}={_format(value)}")
    return argv


def _format(value: Any) -> str:
    """A value as its flag would spell it."""
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return "none" if value is None else str(value)


def _strip_none(kind: Any) -> tuple[Any, bool]:
    """(the type without None, whether None was allowed)."""
    if typing.get_origin(kind) in (Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        stripped = args[0] if len(args) == 1 else Union[tuple(args)]  # noqa: UP007
        return stripped, len(args) < len(typing.get_args(kind))
    return kind, False


def _parser_for(kind: Any) -> tuple[Callable[[str], Any], tuple[Any, ...]]:
    """(a function parsing one flag value, the allowed choices or ())."""
    origin = typing.get_origin(kind)
    if origin is Literal:
        choices = typing.get_args(kind)
        return type(choices[0]), choices
    if origin is tuple:
        return _comma_list(typing.get_args(kind)[0]), ()
    if origin in (Union, types.UnionType):
        if str in typing.get_args(kind):  # e.g. a prompt given as text or as token ids
            return str, ()
        raise TypeError(f"no CLI parser for {kind}")
    if kind in (int, float, str):
        return typing.cast(Callable[[str], Any], kind), ()
    raise TypeError(f"no CLI parser for {kind}")


def _comma_list(item: Callable[[str], Any]) -> Callable[[str], tuple[Any, ...]]:
    def parse(text: str) -> tuple[Any, ...]:
        return tuple(item(part) for part in text.split(",") if part.strip())

    parse.__name__ = f"comma-separated {getattr(item, '__name__', 'value')} list"
    return parse


def _or_none(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse_or_none(text: str) -> Any:
        return None if text.lower() == "none" else parse(text)

    parse_or_none.__name__ = getattr(parse, "__name__", "value")
    return parse_or_none


def _metavar(kind: Any, choices: tuple[Any, ...]) -> str | None:
    if choices:
        return "{" + ",".join(map(str, choices)) + "}"
    if typing.get_origin(kind) is tuple:
        return "X,Y,..."
    return None
