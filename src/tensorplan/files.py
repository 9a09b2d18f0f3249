"""Reading and writing the user's files safely: bounded reads of regular files, atomic writes
that never replace anything but a regular file, and file names quoted for one-line errors.

Every small file tensorplan reads whole (config.json, tokenizer.json, vocabulary.txt, the
batch manifest) goes through `read_bytes`/`read_text` with a size limit, so a symlink to
/dev/zero or a FIFO is refused at once instead of read until MemoryError (or forever).
Every output goes through `atomic_write`/`write_atomic`: a temp file beside the target,
fsynced, renamed over it. A symlink is written through (the link survives, its regular
target is replaced); a device node, FIFO, socket or directory is never replaced.
"""

from __future__ import annotations

import os
import secrets
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, NoReturn

from tensorplan.errors import UserError

MiB = 1 << 20
# What a file read whole may hold. Real ones are far smaller: a CT2 config.json is ~10 KB,
# Whisper's multilingual tokenizer.json ~2.5 MB, vocabulary.txt ~0.5 MB; a manifest holds
# ~0.5 KB per input, so 256 MiB is half a million files.
MAX_MODEL_TEXT_BYTES = 64 * MiB  # config.json, tokenizer.json, vocabulary.txt / .json
MAX_MANIFEST_BYTES = 256 * MiB
_READ_CHUNK = 1 * MiB  # a file that grows while read is read on in these


def quote(path: str | os.PathLike[str]) -> str:
    """`path` as printed in an error line: as is when plain, else a Python-style repr, so a
    name holding a newline or a control character cannot split or forge the line."""
    text = os.fspath(path)
    if text.isprintable() and text == text.strip() and text:
        return text
    return repr(text)


def describe_mode(mode: int) -> str:
    """What a non-regular file is, for an error message."""
    for test, name in ((stat.S_ISDIR, "is a directory"),
                       (stat.S_ISFIFO, "is a FIFO (named pipe)"),
                       (stat.S_ISCHR, "is a character device"), (stat.S_ISBLK, "is a block device"),
                       (stat.S_ISSOCK, "is a socket")):
        if test(mode):
            return name
    return "is not a regular file"


def open_regular(path: str | os.PathLike[str], what: str = "file") -> IO[bytes]:
    """Open `path` for reading, refusing (UserError) anything but a regular file.

    O_NONBLOCK makes opening a FIFO return at once (a blocking open waits for a writer); it
    has no effect on a regular file's reads.
    """
    name = quote(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        raise UserError(f"{name}: cannot read: {reason(e)}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise UserError(f"{name}: cannot read: {describe_mode(mode)}, not a regular {what}")
    return os.fdopen(fd, "rb")


def read_bytes(path: str | os.PathLike[str], limit: int, what: str = "file") -> bytes:
    """The whole content of regular file `path`; UserError past `limit` bytes."""
    with open_regular(path, what) as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise UserError(f"{quote(path)}: {what} of {size} bytes is larger than the "
                            f"{_size(limit)} limit")
        # read(n) reserves n bytes up front: ask for the size stat gave, +1 to catch growth
        data = f.read(size + 1)
        while size < len(data) <= limit and (more := f.read(_READ_CHUNK)):  # it grew
            data += more
    if len(data) > limit:
        raise UserError(f"{quote(path)}: {what} is larger than the {_size(limit)} limit")
    return data


def read_text(path: str | os.PathLike[str], limit: int, what: str = "file") -> str:
    """`read_bytes` decoded as UTF-8 (a byte-order mark is dropped)."""
    data = read_bytes(path, limit, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise UserError(f"{quote(path)}: {what} is not UTF-8 (byte {e.start})") from None


# --- writing ---------------------------------------------------------------------------------


def writable_target(path: str | os.PathLike[str], what: str = "output") -> Path:
    """Where an atomic write of `path` must rename to: `path` itself, or a symlink's final
    target (so the link survives). UserError if that exists and is not a regular file."""
    target = Path(path)
    if _names_a_descriptor(target):
        raise UserError(f"{quote(path)}: names an open descriptor (as /dev/stdout does); "
                        f"writing the {what} renames a new file over what it names, which "
                        "would replace that file or lose the pipe: give a file's path")
    if target.is_symlink():
        target = Path(os.path.realpath(target))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        return target
    except OSError as e:
        raise UserError(f"{quote(path)}: cannot write {what}: {reason(e)}") from None
    if not stat.S_ISREG(mode):
        raise UserError(f"{quote(path)}: {describe_mode(mode)}; the {what} would replace it, "
                        "so it is left alone")
    return target


def _names_a_descriptor(path: Path) -> bool:
    """Whether `path` or a link on the way to its target is a process's descriptor
    (/dev/stdout, /dev/fd/N, /proc/PID/fd/N): `cmd --out /dev/stdout >> log` would
    otherwise rename a new file over `log`."""
    here = Path(os.path.abspath(path))
    for _ in range(40):  # the kernel's own limit on links followed
        if here.parts[1:2] == ("proc",) and "fd" in here.parts or \
                str(here).startswith(("/dev/fd/", "/dev/std")):
            return True
        if not here.is_symlink():
            return False
        here = Path(os.path.abspath(here.parent / os.readlink(here)))
    return False


@contextmanager
def atomic_write(path: str | os.PathLike[str], what: str = "output", *,
                 parents: bool = False) -> Iterator[IO[bytes]]:
    """Write to a hidden temp file beside `path`; fsync and rename it over `path` only if the
    block succeeds, else remove it. A reader never sees a half-written file, and a process
    that has the old file memory-mapped keeps valid pages. `parents`: create the folder
    first. OSErrors become UserErrors."""
    target, tmp, fd = _open_temp(path, what, parents)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException as e:
        _failed(path, tmp, e)
    _fsync_dir(target.parent)


def write_atomic(path: str | os.PathLike[str], data: bytes, what: str = "output", *,
                 parents: bool = False) -> None:
    """`atomic_write` of `data`, written with os.write (no buffering layer to flush)."""
    target, tmp, fd = _open_temp(path, what, parents)
    try:
        try:
            _write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, target)
    except BaseException as e:
        _failed(path, tmp, e)
    _fsync_dir(target.parent)


def check_writable_dir(directory: str | os.PathLike[str]) -> None:
    """That a file can be created in `directory` now (UserError if not), as the outputs'
    temp files will be: for a command whose outputs come at the end of input that cannot
    be read again (a live stream), where a permission problem found then loses them."""
    probe = Path(directory) / f".tensorplan-probe.{secrets.token_hex(6)}.tmp"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as e:
        raise UserError(f"cannot write to output directory {quote(directory)}: "
                        f"{reason(e)}") from None
    os.close(fd)
    with suppress(OSError):  # created is what was asked; a stray probe is harmless
        probe.unlink()


def _open_temp(path: str | os.PathLike[str], what: str, parents: bool) -> tuple[Path, Path, int]:
    """(the rename target, the temp file beside it, the temp file's descriptor)."""
    target = writable_target(path, what)
    if parents:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UserError(f"{quote(path)}: cannot create its folder: {reason(e)}") from None
    tmp = target.with_name(f".{target.name}.{secrets.token_hex(6)}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(tmp, flags, 0o666)  # 0o666 & ~umask, like open(): mkstemp would give 0o600
    except OSError as e:
        raise UserError(f"cannot write to output directory {quote(target.parent)}: "
                        f"{reason(e)}") from None
    try:  # a file replaced keeps its permissions: a private one must not become readable
        os.chmod(tmp, stat.S_IMODE(target.stat().st_mode))
    except FileNotFoundError:
        pass
    except OSError:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    return target, tmp, fd


def _failed(path: str | os.PathLike[str], tmp: Path, e: BaseException) -> NoReturn:
    """Remove the temp file; an OSError becomes a one-line UserError, anything else goes on."""
    tmp.unlink(missing_ok=True)
    if isinstance(e, OSError):
        raise UserError(f"{quote(path)}: cannot write: {reason(e)}") from None
    raise e


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether both name one existing file (hard links and symlinks included)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def reason(e: OSError) -> str:
    if e.strerror:
        return e.strerror
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable where the OS allows fsync on a directory."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _size(n: int) -> str:
    return f"{n // MiB} MiB" if n >= MiB and n % MiB == 0 else f"{n} bytes"


def check_not_input(out: str | os.PathLike[str], inputs: Iterable[str | os.PathLike[str]],
                    flag: str = "--out") -> None:
    """UserError if `out` (links followed) is one of `inputs`, or lies inside an input that
    is a directory: no command writes over what it reads."""
    target = Path(out).expanduser().resolve()
    for source in inputs:
        src = Path(source).expanduser().resolve()
        if target == src or (src.is_dir() and target.is_relative_to(src)):
            what = "is" if target == src else "is inside"
            raise UserError(f"{flag} {quote(out)} {what} the input {quote(source)}: it would "
                            "be overwritten; write elsewhere")
