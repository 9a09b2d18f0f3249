"""Lifetime traces as CSV: `id,lower,upper,size` rows in, `id,offset` rows out.

Rows are parsed one at a time (a million-row trace is never held as text). Row numbers in
errors are file line numbers, the header being row 1. The text is UTF-8, with or without a
byte-order mark (as spreadsheets save it); numbers are ASCII decimal integers that fit in 64
bits. Offsets are written to a temporary file beside the target and renamed over it, so a
reader never sees half a file.

Other columns are allowed and ignored (MiniMalloc's `hint`, `gaps`, `offset`: a buffer
taken as live over its whole [lower, upper) is a harder problem than with its gaps, so
its packing stays valid), except MiniMalloc's per-buffer `alignment`: each must divide
the alignment the trace is packed with, or the packing would break it.
"""

from __future__ import annotations

import codecs
import csv
import io
import os
import re
from collections.abc import Hashable, Iterator, Mapping

from tensorplan.errors import TraceError, UserError
from tensorplan.files import atomic_write, open_regular

COLUMNS = ("id", "lower", "upper", "size")
ALIGNMENT = "alignment"  # MiniMalloc's per-buffer column
_INTEGER = re.compile(r"\s*[+-]?[0-9]+\s*")  # not int()'s "1_000" or non-ASCII digits
_INT64 = range(-(1 << 63), 1 << 63)
# The packers place everything below plan.UNLIMITED (2^62) and give up above it; half of it
# for the sum of all sizes leaves room for alignment padding, so any packing fits.
MAX_TOTAL_SIZE = 1 << 61


def read_trace(path: str | os.PathLike[str],
               alignment: int = 1) -> Iterator[tuple[str, int, int, int]]:
    """Yield (id, lower, upper, size) per row, upper exclusive. Raises TraceError naming
    the row for a missing column or a row with more fields than the header, a column
    named twice, a non-integer or one beyond 64 bits, a negative size, upper <= lower, a
    repeated id, an `alignment` that does not divide `alignment` (the one the offsets
    get), sizes adding up past MAX_TOTAL_SIZE, text that is not UTF-8 or not CSV, or a
    trace with no rows."""
    try:  # a FIFO or /dev/zero is refused: it would never end
        raw = open_regular(path, "trace")
    except UserError as e:
        raise TraceError(str(e)) from None
    with io.TextIOWrapper(raw, newline="", encoding="utf-8-sig") as f:
        rows = csv.reader(f)
        try:
            header = next(rows, None)
            if header is None:
                raise TraceError(f"{path}: empty trace (no header)")
            cols, align_col = _columns(path, header)
            seen: dict[str, int] = {}
            total = 0
            for row in rows:
                if not row:
                    continue  # a blank line
                if len(row) > len(header):  # a field no column names: a stray comma?
                    raise TraceError(f"{path}: row {rows.line_num}: {len(row)} fields, the "
                                     f"header names {len(header)}")
                interval = _parse(path, rows.line_num, row, cols, seen)
                if align_col is not None:
                    _check_alignment(path, rows.line_num, row, align_col, alignment)
                total += interval[3]
                if total > MAX_TOTAL_SIZE:
                    raise TraceError(
                        f"{path}: row {rows.line_num}: sizes add up to more than "
                        f"2^61 bytes, beyond any memory"
                    )
                yield interval
        except UnicodeDecodeError:
            raise TraceError(f"{path}: {_where_not_utf8(path)}: not UTF-8 text") from None
        except csv.Error as e:  # e.g. a field over csv's 128 KiB limit (an unclosed quote)
            raise TraceError(f"{path}: row {rows.line_num}: malformed CSV ({e})") from None
        except OSError as e:
            raise TraceError(f"{path}: cannot read: {e.strerror or e}") from None
        if not seen:
            raise TraceError(f"{path}: no intervals after the header")


def _columns(path: str | os.PathLike[str],
             header: list[str]) -> tuple[tuple[int, ...], int | None]:
    """The positions of COLUMNS, and of ALIGNMENT where the header has it."""
    names = [h.strip().lower() for h in header]
    # blank names (a spreadsheet's empty trailing cells) name nothing and may repeat
    twice = sorted({n for n in names if n and names.count(n) > 1})
    if twice:
        raise TraceError(f"{path}: row 1: column(s) named twice: {', '.join(twice)}")
    missing = [c for c in COLUMNS if c not in names]
    if missing:
        raise TraceError(
            f"{path}: row 1: header lacks column(s) {', '.join(missing)} "
            f"(expected {','.join(COLUMNS)})"
        )
    return (tuple(names.index(c) for c in COLUMNS),
            names.index(ALIGNMENT) if ALIGNMENT in names else None)


def _check_alignment(path: str | os.PathLike[str], line: int, row: list[str], col: int,
                     alignment: int) -> None:
    """A buffer's own alignment is kept where it divides the one every offset gets."""
    text = row[col] if col < len(row) else ""
    if not text.strip():
        return  # none given: any offset
    digits = text.strip()
    if not _INTEGER.fullmatch(text):
        value = 0
    else:  # past 19 digits, beyond any alignment (and int() refuses 4,300)
        value = int(digits) if len(digits.lstrip("+-").lstrip("0")) <= 19 else 1 << 63
    if value < 1:
        raise TraceError(f"{path}: row {line}: alignment must be a positive integer, got "
                         f"{_short(text)}")
    if alignment % value:
        shown = digits if len(digits) <= 24 else digits[:24] + "..."
        raise TraceError(f"{path}: row {line}: alignment {shown} does not divide "
                         f"--alignment {alignment}: pack with an --alignment that it divides")


def _parse(
    path: str | os.PathLike[str],
    line: int,
    row: list[str],
    cols: tuple[int, ...],
    seen: dict[str, int],
) -> tuple[str, int, int, int]:
    where = f"{path}: row {line}"
    if len(row) <= max(cols):
        missing = [name for name, c in zip(COLUMNS, cols, strict=True) if c >= len(row)]
        raise TraceError(f"{where}: missing column(s) {', '.join(missing)} (the row has "
                         f"{len(row)} fields)")
    key = row[cols[0]].strip()
    texts = [row[c] for c in cols[1:]]
    if not all(_INTEGER.fullmatch(t) for t in texts):
        values = ", ".join(f"{n}={_short(t)}" for n, t in zip(COLUMNS[1:], texts, strict=True))
        raise TraceError(f"{where}: lower, upper and size must be integers ({values})")
    try:
        lower, upper, size = (int(t) for t in texts)
    except ValueError:  # over int()'s 4300-digit limit
        lower = upper = size = 1 << 63
    if not all(v in _INT64 for v in (lower, upper, size)):
        raise TraceError(f"{where}: lower, upper and size must fit in 64 bits")
    if size < 0:
        raise TraceError(f"{where}: negative size {size}")
    if upper <= lower:
        raise TraceError(f"{where}: upper ({upper}) <= lower ({lower}); upper is exclusive")
    if key in seen:
        raise TraceError(f"{where}: id {key!r} already used in row {seen[key]}")
    seen[key] = line
    return key, lower, upper, size


def _where_not_utf8(path: str | os.PathLike[str]) -> str:
    """The line and byte of the first invalid UTF-8 byte (the text layer decodes in chunks,
    so the csv reader's line number is not where the error is). Streams: bounded memory."""
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset = lines = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 16):
            try:
                decoder.decode(chunk)
            except UnicodeDecodeError as e:
                at = max(e.start, 0)
                row = lines + chunk.count(b"\n", 0, at) + 1
                return f"row {row} (byte {offset + at})"
            offset, lines = offset + len(chunk), lines + chunk.count(b"\n")
    return f"byte {offset}"  # cut inside a multi-byte character at the end


def _short(text: str, limit: int = 24) -> str:
    """repr of a field, cut so one bad value cannot flood the error line."""
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def write_offsets(path: str | os.PathLike[str], offsets: Mapping[Hashable, int]) -> None:
    """Write `id,offset` rows atomically (files.atomic_write: never a half-written file, never
    over a device or FIFO)."""
    with atomic_write(path, "offsets") as raw:
        f = io.TextIOWrapper(raw, newline="", encoding="utf-8")
        out = csv.writer(f, lineterminator="\n")
        out.writerow(("id", "offset"))
        out.writerows(offsets.items())
        f.flush()
        f.detach()  # atomic_write fsyncs and closes the file
