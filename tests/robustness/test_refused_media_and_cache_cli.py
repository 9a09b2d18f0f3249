"""Hardening, round three (issue #31), through the real CLI (clirun) and the Python API: a
file that refers to other resources, per-request bounds, the weight cache, commands that
would write over their input, and misuse. Each case once read what it should not, ran
without bound, served wrong weights or ended in a traceback; each is now refused with one
line (exit 2) or handled."""

from __future__ import annotations

from pathlib import Path

import pytest
from clirun import FAST, assert_ok, assert_user_error, run_cli
from referring_media import ffconcat, hls_playlist, recording_http_server, transport_stream

REFUSED = "refer to other files or URLs"


# --- 1. a file decodes only its own bytes ----------------------------------------------------


def test_a_playlist_naming_a_local_file_is_refused(tmp_path: Path) -> None:
    segment = transport_stream(tmp_path / "secret.ts")
    assert_ok(run_cli("transcribe", segment, *FAST))  # the named file itself decodes
    for entry in (str(segment), segment.name):  # absolute, and relative to the playlist
        playlist = hls_playlist(tmp_path / "list.m3u8", entry)
        run = run_cli("transcribe", playlist, *FAST)
        assert_user_error(run.rc, run.stderr, "list.m3u8", REFUSED)


def test_a_playlist_naming_a_url_fetches_nothing(tmp_path: Path) -> None:
    transport_stream(tmp_path / "remote.ts")
    with recording_http_server(tmp_path) as (url, requests):
        playlist = hls_playlist(tmp_path / "list.m3u8", f"{url}/remote.ts")
        run = run_cli("transcribe", playlist, *FAST)
        assert_user_error(run.rc, run.stderr, "list.m3u8", REFUSED)
        assert requests == []


def test_a_concat_script_is_refused(tmp_path: Path) -> None:
    target = transport_stream(tmp_path / "other.ts")
    script = ffconcat(tmp_path / "joined.ffconcat", target)
    run = run_cli("transcribe", script, *FAST)
    assert_user_error(run.rc, run.stderr, "joined.ffconcat", REFUSED)


def test_the_duration_probes_follow_no_reference(tmp_path: Path) -> None:
    """The header probes (backend choice, batch ordering) open nothing a playlist names: a
    local segment's duration (2 s) used to come back as the playlist's."""
    from tensorplan.batch.jobs import BYTES_PER_SECOND_GUESS, probe_seconds
    from tensorplan.whisper.planned.backend_choice import audio_seconds

    segment = transport_stream(tmp_path / "secret.ts")
    assert audio_seconds([segment]) == pytest.approx(2.0, abs=0.2)
    playlist = hls_playlist(tmp_path / "list.m3u8", str(segment))
    assert audio_seconds([playlist]) is None
    assert probe_seconds(playlist) == playlist.stat().st_size / BYTES_PER_SECOND_GUESS
    with recording_http_server(tmp_path) as (url, requests):
        remote = hls_playlist(tmp_path / "remote.m3u8", f"{url}/secret.ts")
        assert audio_seconds([remote]) is None
        probe_seconds(remote)
        assert requests == []


# --- 5. no command writes over its input ------------------------------------------------------


def test_export_onto_its_source_is_refused(tmp_path: Path, tiny: Path) -> None:
    import shutil

    model = tmp_path / "tiny"
    shutil.copytree(tiny, model)
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for out in (model, model / "model.bin", model / "tokenizer.json", model / "new.pt"):
        run = run_cli("export", "--model", model, "--format", "ggml", "--out", out)
        assert_user_error(run.rc, run.stderr, "--out", "the input", "write elsewhere")
    exported = tmp_path / "tiny.bin"
    assert_ok(run_cli("export", "--model", model, "--format", "ggml", "--out", exported))
    run = run_cli("export", "--model", exported, "--format", "ggml", "--out", exported)
    assert_user_error(run.rc, run.stderr, "tiny.bin", "the input")
    link = tmp_path / "link.bin"
    link.symlink_to(exported)
    run = run_cli("export", "--model", exported, "--format", "ggml", "--out", link)
    assert_user_error(run.rc, run.stderr, "link.bin", "the input")
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


def test_pack_onto_its_trace_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "t.csv"
    trace.write_text("id,lower,upper,size\na,0,2,8\nb,1,3,8\n")
    run = run_cli("pack", trace, "--out", trace)
    assert_user_error(run.rc, run.stderr, "--out", "the input")
    assert trace.read_text().startswith("id,lower")


# --- 6. misuse --------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["10.0.0.5:99999", "head node:6379", "::::", "ray://:1"])
def test_a_malformed_ray_address_is_one_line(tmp_path: Path, talk: Path, address: str) -> None:
    """Refused before Ray is imported or started (one used to print a 9-line traceback)."""
    run = run_cli("transcribe", "--ray", address, talk, "--output-dir", tmp_path / "out", *FAST)
    assert_user_error(run.rc, run.stderr, "--ray", "HOST:PORT")


def _dense_trace(n: int) -> tuple[list[int], list[int], list[int]]:
    """n buffers all alive at once around step 50: every pair overlaps."""
    import random

    rng = random.Random(2)
    lo = [rng.randrange(0, 50) for _ in range(n)]
    hi = [x + 50 + rng.randrange(0, 1000) for x in lo]
    return lo, hi, [rng.randrange(1, 5000) * 64 for _ in range(n)]


def test_a_dense_trace_search_stops_at_its_deadline() -> None:
    """Building the search's overlap lists is quadratic in a dense trace (20,000 buffers:
    50 s) and ran before the budget was looked at; now it stops at the deadline, and the
    improvement step returns the packing it was given."""
    import time

    from tensorplan.alloc.search.dfs import OutOfTime, Problem
    from tensorplan.alloc.search.improve import improve

    lo, hi, size = _dense_trace(3000)
    with pytest.raises(OutOfTime):
        Problem(lo, hi, size, deadline=time.perf_counter())
    stacked = [sum(size[:k]) for k in range(len(size))]  # a valid packing: one on another
    out = improve(lo, hi, size, (stacked, sum(size)), bound=max(size), max_nodes=10**6,
                  deadline=time.perf_counter())
    assert out.offsets == stacked and out.nodes == 0 and not out.proven
