"""The repository's own hygiene: no merge left half-done, a README a newcomer reads through."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(rb"^(<<<<<<<|>>>>>>>)( |$)", re.M)
README_MAX_LINES = 250


def _tracked_files() -> list[Path]:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (git ls-files lists the tracked files)")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                         check=True).stdout
    return [ROOT / name for name in out.decode().split("\0") if name]


def test_no_merge_conflict_markers_in_tracked_text_files() -> None:
    found = []
    for path in _tracked_files():
        if not path.is_file():
            continue  # deleted in the work tree, not yet committed
        data = path.read_bytes()
        if b"\0" in data[:8192]:
            continue  # binary (audio, fuzz seeds)
        found += [f"{path.relative_to(ROOT)}:{_line(data, m.start())}"
                  for m in MARKER.finditer(data)]
    assert not found, "merge conflict markers at " + ", ".join(found)


def _line(data: bytes, offset: int) -> int:
    return data.count(b"\n", 0, offset) + 1


def test_the_marker_pattern_finds_a_conflict() -> None:
    text = b"a\n<<<<<<< HEAD\nb\n=======\nc\n>>>>>>> main\n"
    assert len(MARKER.findall(text)) == 2
    assert not MARKER.findall(b"x = '<<<<<<<'\n")


def test_readme_is_a_front_door() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    text = "\n".join(lines)
    assert "<!-- test-command" in text  # .ci/run finds its command after this marker
    for page in re.findall(r"\]\((docs/[^)#]+)", text):
        assert (ROOT / page).is_file(), f"README links to a missing {page}"


def test_test_modules_have_unique_names() -> None:
    """pytest imports test files by basename (no __init__.py): two of one name in different
    folders stop the whole run at collection."""
    names: dict[str, list[str]] = {}
    for path in (ROOT / "tests").rglob("test_*.py"):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {n: p for n, p in names.items() if len(p) > 1}


def test_bench_scripts_do_not_shadow_installed_modules() -> None:
    """The bench smoke tests put bench/ on sys.path: a script named like an installed
    package (bench/wyoming.py) hid that package from every later test."""
    from importlib.metadata import packages_distributions

    installed = set(packages_distributions())
    shadowing = sorted(p.stem for p in (ROOT / "bench").glob("*.py") if p.stem in installed)
    assert not shadowing, f"bench scripts named like installed modules: {shadowing}"
