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
                "errors", "files"},
    "batch": {"batch", "whisper", "errors", "files", "machine"},
    "commands": {"commands", "whisper", "batch", "alloc", "pipeline", "backends", "errors", "files",
                 "serve", "machine", "live"},
    "cli": {"errors", "commands"},
    "errors": set(),
    # the server knows sessions, never kernels or buffers (see WHISPER_PUBLIC below)
    "serve": {"serve", "whisper", "errors", "machine", "live"},
    # live transcription: streams over whisper's sessions, below every protocol
    "live": {"live", "whisper", "errors", "machine"},
}
# the modules of tensorplan.whisper that are its public API, all the server may import
WHISPER_PUBLIC = {"tensorplan.whisper", "tensorplan.whisper.api", "tensorplan.whisper.options",
                  "tensorplan.whisper.writers", "tensorplan.whisper.result"}

# the live engine also runs the speech detector's model window by window
LIVE_WHISPER = WHISPER_PUBLIC | {"tensorplan.whisper.vad"}

# Whisper reaches buffers and kernels only through the backend protocol (backends/base.py)
# and the package's factory; never a concrete backend's module.
WHISPER_MAY_IMPORT_FROM_BACKENDS = {"tensorplan.backends", "tensorplan.backends.base",
                                    "tensorplan.backends.threads"}


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


def test_mypy_over_the_whole_package() -> None:
    pytest.importorskip("mypy")
    proc = subprocess.run([sys.executable, "-m", "mypy", str(SRC)], capture_output=True,
                          text=True, cwd=SRC.parents[1])
    assert proc.returncode == 0, proc.stdout + proc.stderr


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
