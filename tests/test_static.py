"""Static checks as tests, so the README's one test command runs them too."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src" / "tensorplan"

# Each layer may import only the layers listed for it (imports point downward).
ALLOWED = {
    "alloc": {"alloc", "tensor", "dtype", "graph", "errors", "files", "machine"},
    "files": {"errors"},  # safe reads and writes: a leaf beside errors, usable by every layer
    "machine": set(),  # the cores this process may use: a leaf, usable by every layer
    "tensor": {"dtype"},
    "dtype": set(),
    "graph": {"tensor"},
    "ops": {"tensor", "dtype"},
    "backends": {"backends", "alloc", "tensor", "dtype", "graph", "ops", "errors", "machine"},
    "pipeline": {"alloc", "tensor", "dtype", "graph", "ops", "errors"},
    "whisper": {"whisper", "backends", "pipeline", "alloc", "tensor", "dtype", "graph", "ops",
                "errors", "files", "machine"},
    "batch": {"batch", "whisper", "errors", "files", "machine"},
    "commands": {"commands", "whisper", "batch", "alloc", "pipeline", "backends", "errors", "files",
                 "serve", "machine", "wyoming", "live"},
    "cli": {"errors", "commands"},
    "errors": set(),
    # the server knows sessions, never kernels or buffers (see WHISPER_PUBLIC below)
    "serve": {"serve", "whisper", "errors", "machine", "live"},
    # other libraries' APIs over the whisper package (faster-whisper's WhisperModel)
    "compat": {"compat", "whisper", "errors"},
    # the Wyoming protocol (Home Assistant) over sessions of the public whisper API
    "wyoming": {"wyoming", "whisper", "errors"},
    # live transcription: streams over whisper's sessions, below every protocol
    "live": {"live", "whisper", "errors", "machine"},
}
# the modules of tensorplan.whisper that are its public API, all the server may import
WHISPER_PUBLIC = {"tensorplan.whisper", "tensorplan.whisper.api", "tensorplan.whisper.options",
                  "tensorplan.whisper.flags",
                  "tensorplan.whisper.limits",  # the bounds a request is held to
                  "tensorplan.whisper.writers", "tensorplan.whisper.result"}

# the live engine also runs the speech detector's model window by window
LIVE_WHISPER = WHISPER_PUBLIC | {"tensorplan.whisper.audio.vad"}

# Whisper reaches buffers and kernels only through the backend protocol (backends/base.py)
# and the package's factory; never a concrete backend's module.
WHISPER_MAY_IMPORT_FROM_BACKENDS = {"tensorplan.backends", "tensorplan.backends.base",
                                    "tensorplan.backends.threads"}


# whisper's wings (one subpackage per stage) and the wings each may import; every wing may
# also import whisper's shared leaves and audio.constants (the one home of the audio constants)
WHISPER_WINGS = {
    "audio": set(),
    "model_files": {"audio"},  # an export writes the mel filters
    "planned": {"model_files", "audio"},  # the backend choice reads a file's length
    "decoding": {"planned", "audio", "model_files"},
}
WHISPER_LEAVES = {"options", "flags", "tokenizer", "result", "limits"}  # on top, importing no wing
AUDIO_CONSTANTS = "tensorplan.whisper.audio.constants"
# the layers below whisper that each wing may import (planned: the whole runtime)
WING_RUNTIME = {
    "audio": {"errors", "files"},
    "model_files": {"errors", "files", "backends"},  # backends.TORCH_INSTALL: a hint's text
    "planned": ALLOWED["whisper"] - {"whisper"},
    "decoding": {"errors", "machine"},  # machine.computing: two encoder lanes share the cores
}


def _modules(path: Path) -> set[str]:
    """Every tensorplan module `path` imports, in full (from-imports of a package count
    the names imported from it as modules when they are)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                "tensorplan"):
            found.add(node.module)
            for alias in node.names:
                if (SRC.parent / (node.module + "." + alias.name).replace(".", "/")).with_suffix(
                        ".py").exists():
                    found.add(f"{node.module}.{alias.name}")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.startswith("tensorplan"))
    return found


def test_whisper_reaches_backends_only_through_the_protocol() -> None:
    for f in sorted((SRC / "whisper").rglob("*.py")):
        used = {m for m in _modules(f) if m.startswith("tensorplan.backends")}
        extra = used - WHISPER_MAY_IMPORT_FROM_BACKENDS
        assert not extra, f"{f.relative_to(SRC)} imports a concrete backend: {sorted(extra)}"


def _imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and node.module.startswith("tensorplan.")
        ):
            found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("tensorplan."):
                    found.add(alias.name.split(".")[1])
    return found


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_imports_point_downward(layer: str) -> None:
    files = sorted((SRC / layer).rglob("*.py")) if (SRC / layer).is_dir() else [SRC / f"{layer}.py"]
    assert files, f"no source for layer {layer}"
    for f in files:
        upward = _imports(f) - ALLOWED[layer]
        assert not upward, f"{f.relative_to(SRC)} imports upward: {sorted(upward)}"


def test_serve_uses_only_the_public_whisper_api() -> None:
    for f in sorted((SRC / "serve").rglob("*.py")):
        for node in ast.walk(ast.parse(f.read_text())):
            names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
                [a.name for a in node.names] if isinstance(node, ast.Import) else []
            for name in names:
                if name.startswith("tensorplan.whisper"):
                    assert name in WHISPER_PUBLIC, f"{f.relative_to(SRC)} imports {name}"


def test_live_uses_only_the_public_whisper_api() -> None:
    for f in sorted((SRC / "live").rglob("*.py")):
        for name in _modules(f):
            if name.startswith("tensorplan.whisper"):
                assert name in LIVE_WHISPER, f"{f.relative_to(SRC)} imports {name}"


@pytest.mark.slow
def test_mypy_over_the_whole_package() -> None:
    pytest.importorskip("mypy")
    proc = subprocess.run([sys.executable, "-m", "mypy", str(SRC)], capture_output=True,
                          text=True, cwd=SRC.parents[1])
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.slow
def test_mypy_strict_on_planner_and_graph() -> None:
    pytest.importorskip("mypy")
    targets = [
        str(SRC / "alloc"),
        str(SRC / "graph.py"),
        str(SRC / "tensor.py"),
        str(SRC / "ops.py"),
        str(SRC / "dtype.py"),
    ]
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *targets],
        capture_output=True,
        text=True,
        cwd=SRC.parents[1],
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_ruff_clean() -> None:
    if shutil.which("ruff") is None and not Path(sys.executable).with_name("ruff").exists():
        pytest.skip("ruff not installed (pip install -e '.[test]' installs it)")
    ruff = shutil.which("ruff") or str(Path(sys.executable).with_name("ruff"))
    proc = subprocess.run(
        [ruff, "check", "src", "tests", "bench"], capture_output=True, text=True, cwd=SRC.parents[1]
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_repository_stands_alone() -> None:
    """Docs and docstrings point into the repository, never at notes a clone lacks."""
    root = SRC.parents[1]
    outside = ("../shared", "shared/reference", "DESIGN.md", "reference/whisper.md",
               "ggml-alloc.md", "planners.md")
    files = [root / "README.md", *root.glob("docs/*.md")]
    for folder in ("src", "tests", "bench"):
        files += (root / folder).rglob("*.py")
    for f in files:
        text = f.read_text(errors="replace")
        found = [o for o in outside if o in text
                 and f.name not in ("test_static.py", "test_cli.py")]  # these check for them
        assert not found, f"{f.relative_to(root)} cites {found}"


def _whisper_part(module: str) -> str | None:
    """The wing or top module of tensorplan.whisper that `module` names, if any."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["tensorplan", "whisper"] and len(parts) > 2 else None


@pytest.mark.parametrize("wing", sorted(WHISPER_WINGS))
def test_whisper_wings_import_only_their_stages(wing: str) -> None:
    files = sorted((SRC / "whisper" / wing).rglob("*.py"))
    assert files, f"no wing {wing}"
    may = WHISPER_WINGS[wing] | WHISPER_LEAVES | {wing}
    for f in files:
        for m in _modules(f):
            part = _whisper_part(m)
            assert part is None or part in may or m == AUDIO_CONSTANTS, \
                f"{f.relative_to(SRC)} imports {m}"
        below = _imports(f) - {"whisper"} - WING_RUNTIME[wing]
        assert not below, f"{f.relative_to(SRC)} imports {sorted(below)}"


def test_whisper_leaves_import_no_wing() -> None:
    for name in sorted(WHISPER_LEAVES):
        f = SRC / "whisper" / f"{name}.py"
        for m in _modules(f):
            part = _whisper_part(m)
            assert part is None or part in WHISPER_LEAVES or m == AUDIO_CONSTANTS, \
                f"{f.relative_to(SRC)} imports {m}"


def test_whisper_wings_say_their_job() -> None:
    for wing in WHISPER_WINGS:
        doc = ast.get_docstring(ast.parse((SRC / "whisper" / wing / "__init__.py").read_text()))
        assert doc and "May import" in doc, f"whisper/{wing}/__init__.py: no job or import rule"



def test_the_hard_trace_search_is_entered_only_from_offline() -> None:
    """alloc/search/ sits behind offline's two entry points; the graph path never imports it."""
    for f in sorted((SRC / "alloc").glob("*.py")):
        used = {m for m in _modules(f) if m.startswith("tensorplan.alloc.search")}
        assert not used or f.name == "offline.py", f"{f.relative_to(SRC)} imports {used}"
    for f in sorted((SRC / "alloc" / "search").glob("*.py")):
        outside = {m.split(".")[1] for m in _modules(f)} - {"alloc", "machine"}
        up = {m for m in _modules(f) if m.startswith("tensorplan.alloc.")
              and not m.startswith("tensorplan.alloc.search")}
        assert not outside and not up, f"{f.relative_to(SRC)} imports {outside | up}"
