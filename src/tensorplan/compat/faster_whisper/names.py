"""Model names as faster-whisper users write them → what tensorplan's load_model opens.

Nothing is downloaded. A name tensorplan ships (tiny.en, base, small) loads from its
package; a directory loads as it is; another faster-whisper name is looked up in
`download_root` as faster-whisper's own download left it (the Hugging Face cache layout,
`models--Systran--faster-whisper-<name>/snapshots/<revision>/model.bin`), so models a user
already downloaded with faster-whisper are reused. Anything else: load_model's error,
which names the file to pass instead.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tensorplan.whisper.model_files.find import OTHER_MODELS


def model_source(model_size_or_path: str, download_root: str | None) -> str:
    if download_root is not None and model_size_or_path in OTHER_MODELS:
        repo = OTHER_MODELS[model_size_or_path][0]
        found = in_hub_cache(Path(download_root).expanduser(), repo)
        if found is not None:
            return os.fspath(found)
    return model_size_or_path


def in_hub_cache(root: Path, repo: str) -> Path | None:
    """The newest snapshot of `repo` under a Hugging Face cache directory holding a model."""
    snapshots = root / ("models--" + repo.replace("/", "--")) / "snapshots"
    found = [p.parent for p in snapshots.glob("*/model.bin")]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


# what faster-whisper's download fetches of a model repository, and so what is copied
MODEL_FILES = ("config.json", "preprocessor_config.json", "model.bin", "tokenizer.json",
               "vocabulary.*")


def hub_cache() -> Path:
    """Where huggingface_hub keeps downloads unless told otherwise (HF_HUB_CACHE, else
    HF_HOME/hub, else ~/.cache/huggingface/hub)."""
    if cache := os.environ.get("HF_HUB_CACHE"):
        return Path(cache).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join("~", ".cache", "huggingface")
    return Path(home).expanduser() / "hub"


def download_model(size_or_id: str, output_dir: str | None = None,
                   local_files_only: bool = False, cache_dir: str | None = None,
                   revision: str | None = None,
                   use_auth_token: str | bool | None = None) -> str:
    """faster-whisper's download_model without the download: the directory of a model
    that is here (a name tensorplan ships, a directory, or a faster-whisper name or Hub
    id already in the Hugging Face cache, `cache_dir` or the default one). With
    `output_dir`, the model's files are copied there and that is returned. A model that
    is not here raises ValueError (as faster-whisper does for an unknown size) saying what
    to pass instead. `local_files_only`, `revision` and `use_auth_token` concern the
    download and change nothing here."""
    del local_files_only, revision, use_auth_token
    from tensorplan.errors import ModelError
    from tensorplan.whisper.model_files.find import resolve_model

    root = Path(cache_dir).expanduser() if cache_dir is not None else hub_cache()
    repo = OTHER_MODELS[size_or_id][0] if size_or_id in OTHER_MODELS else size_or_id
    cached = in_hub_cache(root, repo) if "/" in repo else None
    try:
        found = resolve_model(os.fspath(cached) if cached is not None else size_or_id)
    except ModelError as e:
        raise ValueError(str(e)) from None
    if output_dir is None:
        return os.fspath(found)
    out = Path(output_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    for pattern in MODEL_FILES:
        for f in found.glob(pattern):
            if not (out / f.name).exists() or not (out / f.name).samefile(f):
                shutil.copyfile(f, out / f.name)
    return os.fspath(out)
