"""Fuzzing in CI: every seed (and every past crash saved as a seed) replays through its
harness in-process, then each harness fuzzes for a few seconds under atheris in a subprocess.

FUZZ_SECONDS (default 3) sets the time per harness; the atheris run is skipped, with the
reason printed, where atheris is not installed.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import harnesses
import pytest

HERE = Path(__file__).resolve().parent
CORPUS = HERE / "corpus"
SECONDS = int(os.environ.get("FUZZ_SECONDS", "3"))


def _seeds(name: str) -> list[Path]:
    return sorted(p for p in (CORPUS / name).iterdir() if p.is_file())


@pytest.mark.parametrize("name", list(harnesses.HARNESSES))
def test_corpus_is_small_and_replays(name: str) -> None:
    seeds = _seeds(name)
    assert seeds and sum(p.stat().st_size for p in seeds) < 100_000
    accepted = [harnesses.run(harnesses.HARNESSES[name], p.read_bytes()) for p in seeds]
    assert any(accepted), f"no {name} seed is valid input: the fuzzer starts nowhere"


@pytest.mark.slow
@pytest.mark.parametrize("name", list(harnesses.HARNESSES))
def test_short_fuzz(name: str, tmp_path: Path) -> None:
    if importlib.util.find_spec("atheris") is None:
        pytest.skip("atheris is not installed (pip install atheris): fuzzing skipped")
    scratch = tmp_path / "corpus"
    scratch.mkdir()  # libFuzzer writes new inputs into the first corpus folder
    cmd = [sys.executable, str(HERE / "fuzz.py"), name, f"-max_total_time={SECONDS}",
           "-timeout=30", "-rss_limit_mb=3072", f"-artifact_prefix={tmp_path}/",
           str(scratch), str(CORPUS / name)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=SECONDS + 300,
                          cwd=tmp_path)
    crashes = sorted(p.name for p in tmp_path.iterdir() if p.is_file())
    tail = "\n".join(proc.stderr.splitlines()[-40:])
    assert proc.returncode == 0 and not crashes, f"{name}: {crashes}\n{tail}"
