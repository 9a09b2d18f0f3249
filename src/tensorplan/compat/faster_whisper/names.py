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
