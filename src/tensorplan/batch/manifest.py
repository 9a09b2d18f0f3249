"""The batch manifest: OUT/.tensorplan-manifest.json records, per input, what was done.

Each entry (keyed by the input's output key) holds the input's path and sha256, the settings
it was transcribed with (model and the decoding flags that differ from the defaults), its
status (pending, done or failed), the attempts of the last run, the last error, and the
sha256 of every output it wrote. A rerun skips an input only when all of these still hold:
it is done, its content and settings are unchanged, and every output it should have exists
with the recorded hash. The file is replaced atomically (temp file, fsync, rename), and a
lock file keeps two runs from sharing one OUT.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tensorplan.errors import UserError
from tensorplan.files import MAX_MANIFEST_BYTES, open_regular, read_text, write_atomic

MANIFEST_NAME = ".tensorplan-manifest.json"
LOCK_NAME = ".tensorplan-manifest.lock"
VERSION = 1
STATUSES = ("pending", "done", "failed")


@dataclass(slots=True)
class Entry:
    input: str  # absolute path, for people: entries are found by key
    sha256: str
    settings: dict[str, Any]
    status: str = "pending"
    attempts: int = 0  # in the last run
    error: str | None = None
    outputs: dict[str, str] = field(default_factory=dict)  # path relative to OUT -> sha256
    audio_seconds: float | None = None


class Manifest:
    def __init__(self, out_dir: Path, entries: dict[str, Entry] | None = None) -> None:
        self.out_dir = out_dir
        self.entries = entries or {}

    @property
    def path(self) -> Path:
        return self.out_dir / MANIFEST_NAME

    @classmethod
    def load(cls, out_dir: Path) -> Manifest:
        """The manifest in out_dir, or an empty one. A malformed file raises UserError."""
        path = out_dir / MANIFEST_NAME
        try:
            if not os.path.lexists(path):
                return cls(out_dir)
            data = json.loads(read_text(path, MAX_MANIFEST_BYTES, "manifest"))
        except UserError as e:
            raise UserError(f"{e}; delete it to start over") from None
        except ValueError as e:
            raise UserError(f"{path}: unreadable manifest ({e}); delete it to start over") from None
        try:
            if data["version"] != VERSION:
                raise ValueError(f"version {data['version']}, expected {VERSION}")
            entries = {key: Entry(**value) for key, value in data["files"].items()}
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{path}: not a tensorplan manifest ({e}); delete it to start "
                            "over") from None
        return cls(out_dir, entries)

    def save(self) -> None:
        files = {key: dataclasses.asdict(entry) for key, entry in sorted(self.entries.items())}
        text = json.dumps({"version": VERSION, "files": files}, indent=1)
        write_atomic(self.path, (text + "\n").encode("utf-8"))

    def is_complete(self, key: str, sha256: str, settings: dict[str, Any],
                    outputs: Sequence[str]) -> bool:
        """Whether `key` is done with this input content and settings, and each of `outputs`
        (paths relative to OUT) exists with the hash recorded when it was written."""
        entry = self.entries.get(key)
        if entry is None or entry.status != "done" or entry.sha256 != sha256:
            return False
        if entry.settings != settings:
            return False
        return all(name in entry.outputs and _same_file(self.out_dir / name, entry.outputs[name])
                   for name in outputs)

    def begin(self, key: str, path: Path, sha256: str, settings: dict[str, Any]) -> Entry:
        """A fresh pending entry for a file this run will transcribe."""
        entry = Entry(input=os.path.abspath(path), sha256=sha256, settings=settings)
        self.entries[key] = entry
        return entry


def sha256_file(path: Path) -> str:
    """The file's hash; UserError for a FIFO or device (it could be read forever)."""
    digest = hashlib.sha256()
    with open_regular(path, "audio file") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _same_file(path: Path, sha256: str) -> bool:
    try:
        return sha256_file(path) == sha256
    except (OSError, UserError):
        return False


@contextmanager
def locked(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on out_dir's manifest, or raise UserError if another run has it.
    (A no-op where fcntl is missing, i.e. on Windows.)"""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(out_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise UserError(f"cannot use output directory {out_dir}: {e.strerror or e}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another tensorplan run is writing to {out_dir}") from None
        yield
    finally:
        os.close(fd)
