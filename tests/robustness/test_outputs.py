"""Output files when the disk says no: an output directory that cannot exist, no permission,
or a disk that fills mid-file. Each is one error line (exit 2); no partial or temp file is
left, and every file written before the failure (or there before the run) stays intact.
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from clirun import assert_user_error, run_cli
from synth_audio import wav

from tensorplan import cli
from tensorplan.errors import UserError
from tensorplan.whisper import writers
from tensorplan.whisper.result import Segment, TranscriptionResult
from tensorplan.whisper.writers import FORMATS, write_outputs

RESULT = TranscriptionResult(" Ask not.", (Segment(0, 0, 0.0, 1.5, " Ask not.", (1, 2), 0.0,
                                                    -0.2, 1.0, 0.01),), "en")
needs_proc = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


@pytest.fixture
def one_sample(tmp_path: Path) -> Path:
    """Valid audio with no full frame: transcribes instantly to nothing."""
    path = tmp_path / "talk.wav"
    path.write_bytes(wav(np.array([100], "<i2")))
    return path


def _leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(".tmp"))


def test_output_dir_under_a_regular_file(tmp_path: Path, one_sample: Path) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, not a directory")
    run = run_cli("transcribe", one_sample, "--output-dir", blocker / "out")
    assert_user_error(run.rc, run.stderr, f"cannot create output directory {blocker / 'out'}",
                      "Not a directory")
    assert blocker.read_text() == "a file, not a directory"


def test_output_dir_is_a_regular_file(tmp_path: Path, one_sample: Path) -> None:
    blocker = tmp_path / "out"
    blocker.write_text("keep me")
    run = run_cli("transcribe", one_sample, "--output-dir", blocker)
    assert_user_error(run.rc, run.stderr, f"output directory {blocker} is not a directory")
    assert blocker.read_text() == "keep me"


def test_no_permission_to_write(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_open = os.open

    def denied(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith(".tmp"):  # root writes anywhere: refuse as for a user
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", denied)  # as writers calls it
    with pytest.raises(UserError, match=f"cannot write to output directory {tmp_path}: "
                                        "Permission denied"):
        write_outputs(RESULT, "talk.wav", tmp_path, "all")
    assert list(tmp_path.iterdir()) == []


def _disk_full_at(monkeypatch: pytest.MonkeyPatch, suffix: str) -> None:
    """os.write on the temp file of `<stem>.<suffix>` writes a few bytes, then ENOSPC."""
    real_write = os.write

    def write(fd: int, data: Any) -> int:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if target.endswith(".tmp") and f".{suffix}." in Path(target).name:
            if os.fstat(fd).st_size == 0:
                return real_write(fd, bytes(data)[:5])  # part of the file reaches the disk
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


@needs_proc
def test_disk_full_mid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "talk.srt").write_text("an older transcript")
    (tmp_path / "talk.json").write_text("{}")
    _disk_full_at(monkeypatch, "srt")  # FORMATS: txt, vtt, srt, tsv, json
    with pytest.raises(UserError) as info:
        write_outputs(RESULT, "talk.wav", tmp_path, "all")
    assert str(info.value) == f"{tmp_path / 'talk.srt'}: cannot write: No space left on device"
    assert _leftovers(tmp_path) == []
    assert (tmp_path / "talk.srt").read_text() == "an older transcript"  # not half replaced
    assert (tmp_path / "talk.json").read_text() == "{}"  # never reached
    for fmt in ("txt", "vtt"):  # written before the failure: complete
        assert (tmp_path / f"talk.{fmt}").read_text() == writers.render(RESULT, fmt)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"talk.{f}" for f in ("txt", "vtt", "srt", "json"))
    assert FORMATS.index("srt") == 2


@needs_proc
def test_disk_full_through_the_cli(tmp_path: Path, one_sample: Path,
                                   monkeypatch: pytest.MonkeyPatch,
                                   capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    _disk_full_at(monkeypatch, "vtt")
    rc = cli.main(["transcribe", str(one_sample), "--output-dir", str(out)])
    assert_user_error(rc, capsys.readouterr().err, f"{out / 'talk.vtt'}: cannot write",
                      "No space left on device")
    assert _leftovers(out) == [] and sorted(p.name for p in out.iterdir()) == ["talk.txt"]


class _FillingFile:
    """A text file that takes `room` characters, then fails as a full disk does."""

    def __init__(self, f: Any, room: int) -> None:
        self.f, self.room = f, room

    def write(self, text: str) -> int:
        if len(text) > self.room:
            self.f.write(text[: self.room])
            self.f.flush()
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(text)
        return int(self.f.write(text))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)

    def __enter__(self) -> _FillingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.f.close()


def test_pack_disk_full_mid_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "trace.csv"
    src.write_text("id,lower,upper,size\n" + "".join(f"t{i},{i},{i + 3},64\n"
                                                       for i in range(2000)))
    out = tmp_path / "offsets.csv"
    out.write_text("id,offset\nold,0\n")
    real_fdopen = os.fdopen
    monkeypatch.setattr(os, "fdopen",
                        lambda *a, **k: _FillingFile(real_fdopen(*a, **k), room=1000))
    rc = cli.main(["pack", str(src), "--out", str(out)])
    assert_user_error(rc, capsys.readouterr().err, f"{out}: cannot write: No space left")
    assert out.read_text() == "id,offset\nold,0\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offsets.csv", "trace.csv"]


def _trace(tmp_path: Path) -> Path:
    src = tmp_path / "trace.csv"
    src.write_text("id,lower,upper,size\na,0,2,10\nb,1,3,5\n")
    return src


def test_an_output_naming_a_descriptor_is_refused(tmp_path: Path) -> None:
    """Outputs are written by renaming a new file over the target: through /dev/stdout
    that target is whatever stdout names, so `--out /dev/stdout >> log` replaced the log."""
    run = run_cli("pack", _trace(tmp_path), "--out", "/dev/stdout")
    assert_user_error(run.rc, run.stderr, "/dev/stdout", "open descriptor")


@needs_proc
def test_a_link_through_a_descriptor_is_refused_and_its_file_kept(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = tmp_path / "log.txt"
    log.write_text("precious\n")
    link = tmp_path / "offsets.csv"
    with log.open("a") as f:
        link.symlink_to(f"/proc/self/fd/{f.fileno()}")
        rc = cli.main(["pack", str(_trace(tmp_path)), "--out", str(link)])
    assert_user_error(rc, capsys.readouterr().err, str(link), "open descriptor")
    assert log.read_text() == "precious\n"


def test_a_replaced_output_keeps_its_permissions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "offsets.csv"
    out.write_text("id,offset\nold,0\n")
    out.chmod(0o600)
    assert cli.main(["pack", str(_trace(tmp_path)), "--out", str(out)]) == 0
    assert "old" not in out.read_text()
    assert out.stat().st_mode & 0o777 == 0o600
