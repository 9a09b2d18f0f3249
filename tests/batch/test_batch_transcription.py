"""Batch transcription: inputs, the resumable manifest, retries, worker crashes, Ray actors.

Most tests use a fake model (a module-level loader, so spawned workers can import it) that
decodes the audio for real and "transcribes" it as its duration; the slow ones run tiny.en
on three slices of jfk.wav cut at its pauses, where greedy decoding gives each phrase.
"""

from __future__ import annotations

import dataclasses
import json
import re
import wave
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tensorplan.batch import (
    MANIFEST_NAME,
    InProcessPool,
    LocalPool,
    Manifest,
    ModelSpec,
    Report,
    collect_inputs,
    run_batch,
)
from tensorplan.batch.jobs import CRASH_HOOK, probe_seconds
from tensorplan.batch.manifest import locked
from tensorplan.cli import main
from tensorplan.errors import UserError
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.result import Segment, TranscriptionResult

JFK = Path(__file__).resolve().parents[2] / "samples" / "jfk.wav"
CLIPS = {  # name: (start, end) seconds of jfk.wav, cut in its pauses, and what tiny.en says
    "fellow": (0.0, 2.6, "and so my fellow americans"),
    "ask_not": (2.6, 7.8, "ask not what your country can do for you"),
    "country": (7.8, 11.0, "ask what you can do for your country"),
}
GREEDY = TranscribeOptions(beam_size=None, best_of=None)
FORMATS = ("txt", "json")


# --- a fake model that spawned workers can import -------------------------------------------

CALLS: list[float] = []  # seconds of audio per call, in this process (the in-process pool)


class FakeModel:
    def transcribe(self, samples: np.ndarray, options: TranscribeOptions) -> TranscriptionResult:
        seconds = len(samples) / 16000
        CALLS.append(round(seconds, 1))
        text = f" {seconds:.1f} seconds"
        segment = Segment(0, 0, 0.0, seconds, text, (), 0.0, -0.1, 1.0, 0.0)
        return TranscriptionResult(text, (segment,), "en")


def fake_loader(spec: ModelSpec) -> FakeModel:
    return FakeModel()


def broken_loader(spec: ModelSpec) -> FakeModel:
    raise UserError(f"model {spec.name!r} not found")


FAKE = ModelSpec("fake", loader=fake_loader)


# --- fixtures --------------------------------------------------------------------------------


def write_wav(path: Path, samples: np.ndarray) -> None:
    pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())


@pytest.fixture(scope="module")
def jfk() -> np.ndarray:
    from tensorplan.whisper.audio.decode import load_audio

    return load_audio(JFK)


@pytest.fixture
def clips(tmp_path: Path, jfk: np.ndarray) -> Path:
    folder = tmp_path / "in"
    folder.mkdir()
    for name, (start, end, _) in CLIPS.items():
        write_wav(folder / f"{name}.wav", jfk[int(start * 16000):int(end * 16000)])
    return folder


def batch(folder: Path, out: Path, spec: ModelSpec = FAKE, options: TranscribeOptions = GREEDY,
          workers: int | None = None) -> Report:
    def make_pool(n_files: int) -> InProcessPool | LocalPool:
        if workers is None:
            return InProcessPool(spec, options)
        return LocalPool(spec, options, workers)

    return run_batch(collect_inputs([folder]), out, FORMATS, spec=spec, options=options,
                     make_pool=make_pool, verbose=False)


def manifest(out: Path) -> dict[str, Any]:
    files: dict[str, Any] = json.loads((out / MANIFEST_NAME).read_text())["files"]
    return files


def normalize(text: str) -> str:
    return " ".join(re.sub(r"[^\w\s']", " ", text.lower()).split())


# --- inputs ----------------------------------------------------------------------------------


def test_directories_expand_to_sorted_audio_files_keeping_subfolders(tmp_path: Path) -> None:
    for name in ("b.wav", "a.MP3", "sub/c.flac", "notes.txt", ".hidden.wav", ".git/d.wav"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    extra = tmp_path / "take.raw"  # named directly: taken whatever its extension
    extra.write_bytes(b"x")
    inputs = collect_inputs([tmp_path, extra, tmp_path / "b.wav"])
    assert [i.key for i in inputs] == ["a", "b", "sub/c", "take"]
    (tmp_path / "sub" / "b.ogg").write_bytes(b"x")
    with pytest.raises(UserError, match="would both write b"):
        collect_inputs([tmp_path / "b.wav", tmp_path / "sub" / "b.ogg"])
    with pytest.raises(UserError, match="no such file"):
        collect_inputs([tmp_path / "missing.wav"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(UserError, match="no audio files"):
        collect_inputs([tmp_path / "empty"])


def test_probe_reads_the_container_duration_or_guesses_from_size(clips: Path) -> None:
    assert probe_seconds(clips / "ask_not.wav") == pytest.approx(5.2, abs=0.01)
    junk = clips / "junk.mp3"
    junk.write_bytes(b"\0" * 32_000)
    assert probe_seconds(junk) == pytest.approx(2.0)  # 32 kB at 128 kbit/s


def test_batch_mode_needs_an_output_dir(clips: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["transcribe", str(clips)]) == 2
    assert "--output-dir is needed" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["transcribe", str(clips), "-o", "out", "--workers", "0"])


# --- the manifest ----------------------------------------------------------------------------


def test_rerun_skips_verified_files_and_redoes_changed_ones(clips: Path, tmp_path: Path,
                                                            jfk: np.ndarray) -> None:
    out = tmp_path / "out"
    CALLS.clear()
    first = batch(clips, out)
    assert sorted(first.done) == sorted(CLIPS) and first.exit_code == 0
    assert CALLS == [5.2, 3.2, 2.6]  # longest first
    assert (out / "ask_not.txt").read_text() == "5.2 seconds\n"
    entry = manifest(out)["ask_not"]
    assert entry["status"] == "done" and entry["attempts"] == 1
    assert set(entry["outputs"]) == {"ask_not.txt", "ask_not.json"}

    assert batch(clips, out).skipped == sorted(CLIPS)  # nothing changed

    (out / "fellow.txt").write_text("2.7 seconds\n")  # an output edited, its size unchanged
    (out / "ask_not.json").unlink()  # an output missing
    write_wav(clips / "country.wav", jfk[:16000])  # the input changed
    again = batch(clips, out)
    assert sorted(again.done) == ["ask_not", "country", "fellow"]
    assert (out / "country.txt").read_text() == "1.0 seconds\n"
    assert (out / "fellow.txt").read_text() == "2.6 seconds\n"

    other = dataclasses.replace(GREEDY, temperature=(0.0,))  # other settings: all redone
    assert sorted(batch(clips, out, options=other).done) == sorted(CLIPS)


def test_a_bad_file_is_retried_reported_and_retried_on_rerun(clips: Path, tmp_path: Path) -> None:
    (clips / "broken.mp3").write_bytes(b"not audio" * 100)
    out = tmp_path / "out"
    report = batch(clips, out)
    assert sorted(report.done) == sorted(CLIPS) and report.exit_code == 2
    assert "broken.mp3: not a readable audio file" in report.failed["broken"]
    entry = manifest(out)["broken"]
    assert (entry["status"], entry["attempts"]) == ("failed", 2)
    assert "not a readable audio file" in entry["error"]

    rerun = batch(clips, out)
    assert rerun.skipped == sorted(CLIPS) and list(rerun.failed) == ["broken"]
    assert rerun.exit_code == 2

    (clips / "broken.mp3").unlink()
    (clips / "broken.mp3").symlink_to(clips / "gone.mp3")  # unreadable: failed without a try
    assert "broken.mp3: cannot read" in batch(clips, out).failed["broken"]


def test_a_malformed_manifest_or_a_second_run_is_refused(tmp_path: Path) -> None:
    with locked(tmp_path), pytest.raises(UserError, match="another tensorplan run"):
        with locked(tmp_path):
            pass
    (tmp_path / MANIFEST_NAME).write_text("{")
    with pytest.raises(UserError, match="unreadable manifest"):
        Manifest.load(tmp_path)


# --- worker processes ------------------------------------------------------------------------


def test_a_crashed_worker_is_replaced_and_its_file_requeued(clips: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    monkeypatch.setenv(CRASH_HOOK, "ask_not.wav")  # its worker os._exit()s on attempt 1
    out = tmp_path / "out"
    report = batch(clips, out, workers=2)
    assert sorted(report.done) == sorted(CLIPS) and not report.failed
    assert {k: e["attempts"] for k, e in manifest(out).items()} == {
        "ask_not": 2, "country": 1, "fellow": 1}
    assert (out / "ask_not.txt").read_text() == "5.2 seconds\n"
    assert "worker process died (exit code 70)" in capsys.readouterr().err


def test_a_model_that_does_not_load_stops_the_run_before_any_file(clips: Path,
                                                                   tmp_path: Path) -> None:
    with pytest.raises(UserError, match="could not load the model: model 'nope' not found"):
        batch(clips, tmp_path / "out", spec=ModelSpec("nope", loader=broken_loader), workers=2)
    assert {e["status"] for e in manifest(tmp_path / "out").values()} == {"pending"}


@pytest.mark.slow
def test_cli_workers_transcribe_a_folder_with_a_corrupt_file(clips: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]
                                                             ) -> None:
    """tiny.en in two worker processes; the corrupt file fails twice and the exit code is 2."""
    (clips / "broken.mp3").write_bytes(b"not audio" * 100)
    out = tmp_path / "out"
    code = main(["transcribe", str(clips), "-o", str(out), "-f", "txt,json", "--workers", "2",
                 "--beam-size", "none", "--best-of", "none", "--no-verbose"])
    assert code == 2
    for name, (_, _, text) in CLIPS.items():
        assert normalize((out / f"{name}.txt").read_text()) == text
        assert json.loads((out / f"{name}.json").read_text())["language"] == "en"
    entries = manifest(out)
    assert {k: e["status"] for k, e in entries.items()} == {
        "ask_not": "done", "broken": "failed", "country": "done", "fellow": "done"}
    err = capsys.readouterr().err
    assert "broken: failed 2 times" in err and "3 transcribed" in err


# --- Ray -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ray_local() -> Iterator[Any]:
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'tensorplan[ray]'")
    ray.init(num_cpus=2, include_dashboard=False, logging_level="warning")
    yield ray
    ray.shutdown()


@pytest.mark.slow
def test_ray_actors_transcribe_and_a_dead_actor_is_replaced(ray_local: Any, clips: Path,
                                                            tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    from tensorplan.batch.ray_pool import RayPool

    monkeypatch.setenv(CRASH_HOOK, "country.wav")  # forwarded to the actors
    spec, out = ModelSpec("tiny.en"), tmp_path / "out"
    report = run_batch(collect_inputs([clips]), out, FORMATS, spec=spec, options=GREEDY,
                       make_pool=lambda n: RayPool(spec, GREEDY, "auto", n_workers=2),
                       verbose=False)
    assert sorted(report.done) == sorted(CLIPS) and not report.failed
    for name, (_, _, text) in CLIPS.items():
        assert normalize((out / f"{name}.txt").read_text()) == text
    entries = manifest(out)
    assert all(e["status"] == "done" for e in entries.values())
    assert entries["country"]["attempts"] == 2
    assert ray_local.is_initialized()  # a Ray it did not start is left running


def test_subtitle_options_are_part_of_the_settings() -> None:
    """srt/vtt made with other line options are other outputs; unset, old manifests match."""
    from tensorplan.batch.run import _settings
    from tensorplan.whisper.writers import SubtitleOptions

    spec, options = ModelSpec("tiny.en"), TranscribeOptions()
    assert _settings(spec, options, SubtitleOptions()) == _settings(spec, options)
    assert "subtitles" not in _settings(spec, options)
    narrow = _settings(spec, options, SubtitleOptions(max_line_width=20))
    assert narrow["subtitles"]["max_line_width"] == 20
