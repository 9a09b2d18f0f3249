"""tensorplan.compat.faster_whisper held side by side against the installed faster-whisper.

Both sides run greedy (beam_size=1) on the CPU: faster-whisper with CTranslate2's
compute_type="float32", tensorplan with compute_type="float32", over the same tiny.en
CTranslate2 directory. Text must be equal; segment and word times within TIME_TOLERANCE.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
from pathlib import Path

import make_speech
import numpy as np
import pytest
from conftest import JFK, faster_whisper
from vad_available import needs_vad

from tensorplan.compat import faster_whisper as compat
from tensorplan.compat.faster_whisper import REFUSED, Unsupported
from tensorplan.errors import ModelError

TIME_TOLERANCE = 0.1  # seconds, for segment and word times (docs/compat.md)
GREEDY = {"beam_size": 1}


def both(fw, tp, audio, **kwargs):
    """(faster-whisper's segments, info), (tensorplan's segments, info)."""
    fs, fi = fw.transcribe(audio, **kwargs)
    ts, ti = tp.transcribe(audio, **kwargs)
    return (list(fs), fi), (list(ts), ti)


def assert_same(f_segments, t_segments, words: bool = False, duration: float = 1e9) -> None:
    """Same text, ids and windows; times within TIME_TOLERANCE. tensorplan ends no segment
    after the audio (`duration`), where faster-whisper may take a timestamp token that
    points into the last window's zero padding."""
    assert [s.text for s in t_segments] == [s.text for s in f_segments]
    for f, t in zip(f_segments, t_segments, strict=True):
        assert t.id == f.id and t.seek == f.seek
        assert abs(t.start - f.start) <= TIME_TOLERANCE, (f, t)
        assert abs(t.end - min(f.end, duration)) <= TIME_TOLERANCE, (f, t)
        if words:
            assert [w.word for w in t.words] == [w.word for w in f.words]
            for fw_word, tp_word in zip(f.words, t.words, strict=True):
                assert abs(tp_word.start - fw_word.start) <= TIME_TOLERANCE
                assert abs(tp_word.end - fw_word.end) <= TIME_TOLERANCE
                assert abs(tp_word.probability - fw_word.probability) < 0.05


# --- the API's shape ---------------------------------------------------------------------


def _params(fn):
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


@pytest.mark.parametrize("name", ["WhisperModel.__init__", "WhisperModel.transcribe",
                                  "WhisperModel.detect_language",
                                  "BatchedInferencePipeline.__init__",
                                  "BatchedInferencePipeline.transcribe", "decode_audio",
                                  "format_timestamp", "download_model"])
def test_signatures_equal_faster_whispers(name: str) -> None:
    def lookup(module):
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj

    assert _params(lookup(compat)) == _params(lookup(faster_whisper))


@pytest.mark.parametrize("cls", ["Segment", "Word", "TranscriptionInfo", "TranscriptionOptions"])
def test_result_types_have_faster_whispers_fields(cls: str) -> None:
    from faster_whisper import transcribe as reference

    ours = [f.name for f in dataclasses.fields(getattr(compat, cls))]
    assert ours == [f.name for f in dataclasses.fields(getattr(reference, cls))]


def test_vad_options_have_faster_whispers_fields() -> None:
    from faster_whisper.vad import VadOptions

    assert [(f.name, f.default) for f in dataclasses.fields(compat.VadOptions)] == \
        [(f.name, f.default) for f in dataclasses.fields(VadOptions)]


def test_supported_languages_and_format_timestamp(fw, tp) -> None:
    assert tp.supported_languages == fw.supported_languages == ["en"]
    for seconds in (0, 1.5, 61.001, 3725.25):
        assert compat.format_timestamp(seconds) == faster_whisper.format_timestamp(seconds)


# --- the same transcripts ----------------------------------------------------------------


def test_jfk_same_text_times_and_types(fw, tp, jfk) -> None:
    (fs, fi), (ts, ti) = both(fw, tp, jfk, word_timestamps=True, **GREEDY)
    assert_same(fs, ts, words=True)
    assert "".join(s.text for s in ts).strip() == ("And so my fellow Americans ask not what "
                                                  "your country can do for you ask what you "
                                                  "can do for your country")
    for f, t in zip(fs, ts, strict=True):
        for field in dataclasses.fields(f):
            fv, tv = getattr(f, field.name), getattr(t, field.name)
            if field.name == "words":
                assert isinstance(tv, list) and all(isinstance(w, compat.Word) for w in tv)
                for w in tv:
                    assert isinstance(w.word, str) and isinstance(w.probability, float)
                    assert isinstance(w.start, float) and isinstance(w.end, float)
            elif isinstance(fv, bool | int) and not isinstance(fv, float):
                assert type(tv) is type(fv), field.name
            elif isinstance(fv, float):
                assert isinstance(tv, float), field.name
            else:
                assert type(tv) is type(fv), field.name
        assert all(type(tok) is int for tok in t.tokens)
    for field in ("language", "language_probability", "duration", "duration_after_vad",
                  "all_language_probs", "vad_options"):
        assert getattr(ti, field) == getattr(fi, field), field
    assert dataclasses.asdict(ti.transcription_options).keys() == \
        dataclasses.asdict(fi.transcription_options).keys()


def test_generated_speech_same_text(fw, tp, short_clips) -> None:
    for clip in short_clips:
        (fs, _), (ts, info) = both(fw, tp, clip, **GREEDY)
        assert_same(fs, ts, duration=info.duration)


@pytest.mark.slow
def test_long_generated_speech_same_text(fw, tp, long_clip) -> None:
    for clip in [long_clip]:
        (fs, _), (ts, info) = both(fw, tp, clip, **GREEDY)
        assert_same(fs, ts, duration=info.duration)
    assert ts[-1].seek >= 3000  # the long clip reached its second window


def test_word_times_on_generated_speech(fw, tp, short_clips) -> None:
    (fs, _), (ts, _) = both(fw, tp, short_clips[1], word_timestamps=True, **GREEDY)
    assert_same(fs, ts, words=True)


@pytest.mark.parametrize("clips", ["2.5,7", [4.0], "0,3,5,9"])
def test_clip_timestamps(fw, tp, jfk, clips) -> None:
    (fs, _), (ts, _) = both(fw, tp, jfk, clip_timestamps=clips, **GREEDY)
    assert ts and ts[0].start >= float(str(clips).strip("[]").split(",")[0]) - 0.01
    assert_same(fs, ts)


@pytest.mark.parametrize("kwargs", [{"prefix": "And so, my"},
                                    {"initial_prompt": "President Kennedy's inaugural "
                                                       "address, 1961."},
                                    {"hotwords": "Americans, country"}],
                         ids=["prefix", "initial_prompt", "hotwords"])
def test_prompting(fw, tp, jfk, kwargs) -> None:
    (fs, _), (ts, _) = both(fw, tp, jfk, **kwargs, **GREEDY)
    assert_same(fs, ts)
    if "prefix" in kwargs:
        assert ts[0].text.startswith(" And so, my")


@needs_vad
def test_vad_filter_moves_times_back(fw, tp, jfk) -> None:
    quiet = np.zeros(16000 * 5, np.float32)
    audio = np.concatenate([quiet, jfk, quiet])
    (fs, fi), (ts, ti) = both(fw, tp, audio, vad_filter=True, **GREEDY)
    # the speech's last segment ends where the speech does (duration_after_vad, mapped
    # back); faster-whisper's last timestamp token may point into the padding after it
    assert ts[-1].end <= fs[-1].end + TIME_TOLERANCE and ts[-1].end < ti.duration - 4
    assert_same(fs, ts, duration=ts[-1].end)
    assert ts[0].start >= 4.0  # the five silent seconds are restored before the speech
    assert ti.duration == fi.duration
    # tensorplan frames the VAD windows as silero-vad does (vad.py): the padding differs
    assert abs(ti.duration_after_vad - fi.duration_after_vad) < 0.5
    assert ti.duration_after_vad < ti.duration - 8
    assert dataclasses.asdict(ti.vad_options) == dataclasses.asdict(fi.vad_options)


def test_empty_audio(fw, tp) -> None:
    empty = np.zeros(0, np.float32)
    (fs, fi), (ts, ti) = both(fw, tp, empty)
    assert ts == fs == []
    assert ti.duration == fi.duration == 0
    assert ti.language == fi.language


def test_without_timestamps(fw, tp, jfk) -> None:
    (fs, _), (ts, _) = both(fw, tp, jfk, without_timestamps=True, **GREEDY)
    assert len(ts) == 1
    assert_same(fs, ts)
    assert not any(tok >= 50257 for tok in ts[0].tokens if tok != 50256)


@pytest.mark.slow
def test_beam_search_same_text(fw, tp, jfk) -> None:
    (fs, _), (ts, _) = both(fw, tp, jfk)  # faster-whisper's default: beam_size=5
    assert [s.text for s in ts] == [s.text for s in fs]


def test_beams_past_the_planned_five_as_faster_whisper_takes_them(fw, jfk) -> None:
    # a model of its own: the one the module shares would be left planned for 8
    model = compat.WhisperModel("tiny.en", device="cpu", compute_type="float32", cpu_threads=2)
    (fs, _), (ts, _) = both(fw, model, jfk, beam_size=8)
    assert [s.text for s in ts] == [s.text for s in fs]
    assert model.whisper.model.max_batch == 8


def test_segments_and_words_keep_the_deprecated_asdict(tp, jfk) -> None:
    segments, _ = tp.transcribe(jfk, word_timestamps=True, beam_size=1)
    segment = next(iter(segments))
    with pytest.warns(DeprecationWarning):
        assert segment._asdict() == dataclasses.asdict(segment)
    with pytest.warns(DeprecationWarning):
        assert segment.words[0]._asdict() == dataclasses.asdict(segment.words[0])


# --- lazy, as decoded --------------------------------------------------------------------


class StepCounter:
    """Counts the windows tensorplan decodes (each SeekLoop.step is one window)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from tensorplan.whisper.decoding.seek_loop import SeekLoop

        self.n = 0
        step = SeekLoop.step

        def counted(loop, seek, clip_end):
            self.n += 1
            return step(loop, seek, clip_end)

        monkeypatch.setattr(SeekLoop, "step", counted)


def test_first_segment_before_the_last_window(tp, long_clip, monkeypatch) -> None:
    steps = StepCounter(monkeypatch)
    segments, _ = tp.transcribe(long_clip, **GREEDY)
    assert steps.n == 0  # nothing decoded before the loop reads
    first = next(iter(segments))
    at_first = steps.n
    rest = list(segments)
    assert first.id == 1 and rest
    assert at_first < steps.n, (at_first, steps.n)  # windows were decoded after it


def test_stopping_early_stops_the_decode(tp, long_clip, monkeypatch) -> None:
    steps = StepCounter(monkeypatch)
    segments, info = tp.transcribe(long_clip, **GREEDY)
    assert info.duration > 45  # two windows at least
    for _segment in segments:
        break
    segments.close()  # joins the decoding thread
    assert steps.n == 1  # the first window's segments outnumber the queue: it stopped there


def test_an_error_in_the_decode_reaches_the_reader(tp, jfk, monkeypatch) -> None:
    from tensorplan.whisper.decoding.seek_loop import SeekLoop

    def broken(*args):
        raise RuntimeError("window failed")

    monkeypatch.setattr(SeekLoop, "step", broken)
    segments, _ = tp.transcribe(jfk)
    with pytest.raises(RuntimeError, match="window failed"):
        list(segments)


# --- the batched pipeline, language, audio -----------------------------------------------


@pytest.mark.slow
def test_batched_pipeline(fw, tp, long_clip) -> None:
    fs, fi = faster_whisper.BatchedInferencePipeline(fw).transcribe(long_clip, batch_size=4,
                                                                     **GREEDY)
    ts, ti = compat.BatchedInferencePipeline(tp).transcribe(long_clip, batch_size=4, **GREEDY)
    fs, ts = list(fs), list(ts)
    assert [s.id for s in ts] == list(range(1, len(ts) + 1))
    assert all(s.words is None and s.temperature == 0.0 for s in ts)
    assert ti.duration == fi.duration and ti.language == fi.language == "en"

    def words(text: str) -> set[str]:
        return set(re.sub(r"[^a-z ]", "", text.lower()).split())

    expected = words(make_speech.TEXT)
    for segments in (fs, ts):  # espeak's voice: tiny.en gets most words, both sides alike
        said = words(" ".join(s.text for s in segments))
        assert len(said & expected) > 0.7 * len(expected), sorted(expected - said)
    assert ts[-1].end > 40


def test_batched_short_audio_without_vad(fw, tp, jfk) -> None:
    fs, _ = faster_whisper.BatchedInferencePipeline(fw).transcribe(jfk, vad_filter=False,
                                                                   **GREEDY)
    ts, _ = compat.BatchedInferencePipeline(tp).transcribe(jfk, vad_filter=False, **GREEDY)
    assert [s.text for s in ts] == [s.text for s in fs]


def test_batched_long_audio_without_vad_or_clips_is_refused_as_faster_whisper_does(
        tp, long_clip) -> None:
    with pytest.raises(RuntimeError, match="No clip timestamps found"):
        compat.BatchedInferencePipeline(tp).transcribe(long_clip, vad_filter=False)


def test_detect_language_on_an_english_model(tp, jfk) -> None:
    language, probability, ranked = tp.detect_language(jfk)
    assert (language, probability) == ("en", 1.0) and ranked[0] == ("en", 1.0)


def test_decode_audio_matches(jfk) -> None:
    ours = compat.decode_audio(str(JFK))
    assert ours.dtype == np.float32 and ours.shape == jfk.shape
    assert np.abs(ours - jfk).max() < 1e-3
    with open(JFK, "rb") as f:
        assert compat.decode_audio(f).shape == jfk.shape
    assert compat.decode_audio(str(JFK), sampling_rate=8000).shape == (len(jfk) // 2,)


@pytest.mark.parametrize("rate", [0, -1, 50_000_000, 16000.0, True, "16000"])
def test_decode_audio_names_a_bad_sampling_rate(rate) -> None:
    """5e7 Hz held 2.2 GB for jfk's 11 s, 0 divided by zero: a rate is checked first."""
    with pytest.raises(ValueError, match="^decode_audio: sampling_rate .*1000 to 768000"):
        compat.decode_audio(str(JFK), sampling_rate=rate)


# --- refusals, by name -------------------------------------------------------------------

REFUSED_VALUES = {
    "repetition_penalty": 1.2, "no_repeat_ngram_size": 3, "length_penalty": 0.5,
    "chunk_length": 20, "language_detection_segments": 2, "initial_prompt": [50363, 843],
}


@pytest.mark.parametrize("kwargs,said", [
    ({"language": 5}, "^language must be a string"),
    ({"hotwords": 5}, "^hotwords must be a string"),
    ({"prefix": 5}, "^prefix must be a string"),
    ({"clip_timestamps": [{"start": 0, "end": 3}]}, "^clip_timestamps must be seconds"),
])
def test_mistyped_arguments_are_named(tp, jfk, kwargs, said: str) -> None:
    """Each was an AttributeError or TypeError from deep inside."""
    with pytest.raises(ValueError, match=said):
        list(tp.transcribe(jfk, beam_size=1, **kwargs)[0])


def test_batched_clips_missing_a_field_are_named(tp, jfk) -> None:
    with pytest.raises(ValueError, match="^clip_timestamps must be dicts"):
        compat.BatchedInferencePipeline(tp).transcribe(jfk, clip_timestamps=[{"begin": 5}])


@pytest.mark.parametrize("audio", [None, [0.0] * 16000, 5])
def test_audio_of_another_kind_is_named(tp, audio) -> None:
    with pytest.raises(TypeError, match="^audio must be a path"):
        tp.transcribe(audio)


def test_a_files_bytes_are_audio_as_tensorplans_own_api_takes_them(tp, jfk) -> None:
    segments, _ = tp.transcribe(JFK.read_bytes(), beam_size=1)
    assert "ask not what your country" in "".join(s.text for s in segments).lower()


def test_every_refusal_is_tested() -> None:
    init_only = {"device_index", "files", "revision", "use_auth_token", "split_stereo"}
    assert set(REFUSED) == set(REFUSED_VALUES) | init_only


@pytest.mark.parametrize("name", sorted(REFUSED_VALUES))
def test_transcribe_refuses_by_name(tp, jfk, name: str) -> None:
    with pytest.raises(Unsupported, match=f"^{name}="):
        tp.transcribe(jfk, **{name: REFUSED_VALUES[name]})
    with pytest.raises(Unsupported, match=f"^{name}="):
        compat.BatchedInferencePipeline(tp).transcribe(jfk, **{name: REFUSED_VALUES[name]})


@pytest.mark.parametrize("name,value", [("compression_ratio_threshold", 2.0),
                                        ("condition_on_previous_text", False),
                                        ("prompt_reset_on_temperature", 0.8),
                                        ("prefix", "And"),
                                        ("hallucination_silence_threshold", 2.0)])
def test_batched_refuses_what_it_would_ignore(tp, jfk, name: str, value) -> None:
    with pytest.raises(Unsupported, match=f"^{name}=.*batched pipeline"):
        compat.BatchedInferencePipeline(tp).transcribe(jfk, **{name: value})


@pytest.mark.parametrize("kwargs,name", [({"device_index": 1}, "device_index"),
                                         ({"files": {"model.bin": b""}}, "files"),
                                         ({"revision": "main"}, "revision"),
                                         ({"use_auth_token": "hf_x"}, "use_auth_token"),
                                         ({"flash_attention": True}, "flash_attention"),
                                         ({"compute_type": "float16"}, "compute_type")])
def test_model_refuses_by_name(kwargs, name: str) -> None:
    with pytest.raises(Unsupported, match=f"^{name}="):
        compat.WhisperModel("tiny.en", device="cpu", **kwargs)


def test_split_stereo_refused() -> None:
    with pytest.raises(Unsupported, match="^split_stereo="):
        compat.decode_audio(str(JFK), split_stereo=True)


def test_multilingual_on_an_english_model_is_turned_off_as_faster_whisper_does(tp, jfk,
                                                                                caplog) -> None:
    segments, info = tp.transcribe(jfk, multilingual=True, language="fr", **GREEDY)
    assert info.language == "en" and info.transcription_options.multilingual is False
    assert list(segments)
    assert "English-only" in caplog.text


def test_models_are_never_downloaded(tmp_path) -> None:
    with pytest.raises(ModelError, match="not packaged"):
        compat.WhisperModel("medium.en", device="cpu", download_root=str(tmp_path))
    with pytest.raises(ModelError, match="no such model"):
        compat.WhisperModel("no-such-model", local_files_only=True)


def test_download_root_reuses_a_faster_whisper_download(tmp_path, model_dir) -> None:
    import os

    snapshot = tmp_path / "models--Systran--faster-whisper-tiny" / "snapshots" / "abc123"
    snapshot.mkdir(parents=True)
    for name in os.listdir(model_dir):
        (snapshot / name).symlink_to(os.path.join(model_dir, name))
    model = compat.WhisperModel("tiny", device="cpu", download_root=str(tmp_path))
    assert model.whisper.name == str(snapshot)


def test_every_public_name_of_faster_whisper_is_here() -> None:
    assert set(faster_whisper.__all__) <= set(compat.__all__)
    assert all(hasattr(compat, name) for name in compat.__all__)


def test_download_model_finds_what_is_here_and_downloads_nothing(tmp_path, model_dir,
                                                                  monkeypatch) -> None:
    import os

    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    assert (Path(compat.download_model("tiny.en")) / "model.bin").is_file()
    with pytest.raises(ValueError, match="not packaged"):  # not in any cache: no download
        compat.download_model("medium.en")
    with pytest.raises(ValueError, match="no such model"):
        compat.download_model("no-such-model")
    # a faster-whisper download in a cache, by name and by Hub id
    snapshot = tmp_path / "hub" / "models--Systran--faster-whisper-tiny" / "snapshots" / "abc"
    snapshot.mkdir(parents=True)
    for name in os.listdir(model_dir):
        (snapshot / name).symlink_to(os.path.join(model_dir, name))
    for name in ("tiny", "Systran/faster-whisper-tiny"):
        assert compat.download_model(name, cache_dir=str(tmp_path / "hub")) == str(snapshot)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert compat.download_model("tiny") == str(snapshot)
    # output_dir: the model's files copied there, and that directory loads
    out = tmp_path / "copy"
    assert compat.download_model("tiny", output_dir=str(out)) == str(out)
    assert (out / "model.bin").read_bytes() == (snapshot / "model.bin").read_bytes()
    assert compat.WhisperModel(str(out), device="cpu").whisper.dims.n_audio_state > 0


def test_bad_values_name_faster_whispers_argument(tp, jfk) -> None:
    with pytest.raises(ValueError, match="log_prob_threshold"):
        tp.transcribe(jfk, log_prob_threshold=float("nan"))
    with pytest.raises(ValueError, match="vad_parameters"):
        tp.transcribe(jfk, vad_filter=True, vad_parameters={"no_such_option": 1})
    with pytest.raises(ValueError, match="vad_parameters must be a dict or a VadOptions"):
        tp.transcribe(jfk, vad_filter=True, vad_parameters="x")  # was silently ignored
    with pytest.raises(ValueError, match="unknown language 'xx'"):
        tp.transcribe(jfk, language="xx")
    # at the call, not while iterating the segments (a UserError came from the decoder)
    with pytest.raises(ValueError, match="^suppress_tokens: token id 1000000000"):
        tp.transcribe(jfk, suppress_tokens=[10**9])
    with pytest.raises(ValueError, match="^temperature must be a number"):
        tp.transcribe(jfk, temperature="0.0,0.5")
    batched = compat.BatchedInferencePipeline(tp)
    with pytest.raises(ValueError, match="^suppress_tokens"):
        batched.transcribe(jfk, suppress_tokens=[10**9])
    with pytest.raises(ValueError, match="^temperature"):
        batched.transcribe(jfk, temperature=["hot"])


def test_cpu_threads_past_the_limit_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="^cpu_threads must be 0 .all cores. to 1024"):
        compat.WhisperModel("tiny.en", device="cpu", cpu_threads=10**6)


def test_a_buffer_reused_after_transcribe_does_not_change_the_text(fw, tp, jfk) -> None:
    """The segments are decoded while they are read: the caller's array is copied first, as
    faster-whisper has its features before transcribe() returns (it read [] before)."""
    for model in (fw, tp):
        buffer = jfk.copy()
        segments, _ = model.transcribe(buffer, **GREEDY)
        buffer[:] = 0
        assert "fellow Americans" in "".join(s.text for s in segments)


def test_a_language_name_is_reported_as_its_code(tp, jfk) -> None:
    for name in ("EN", "English"):
        segments, info = tp.transcribe(jfk, language=name, **GREEDY)
        assert info.language == "en" and "Americans" in "".join(s.text for s in segments)


def test_hallucination_silence_threshold_without_word_times_is_ignored_as_faster_whisper_does(
        fw, tp, jfk) -> None:
    (f_segments, _), (t_segments, _) = both(fw, tp, jfk, hallucination_silence_threshold=0.5,
                                            **GREEDY)
    assert_same(f_segments, t_segments, duration=len(jfk) / 16000)
