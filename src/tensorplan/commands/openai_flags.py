"""openai-whisper's flags that have no tensorplan setting of their own: --fp16 and
--model-dir, so that scripts written for `whisper` run unchanged (its --device and
--threads are model options: whisper/planned/load_options.py).

They are added and checked here, in one place. `apply(args)` runs before the model loads.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from tensorplan.errors import UserError


def add_arguments(group: Any) -> None:
    group.add_argument("--fp16", action=argparse.BooleanOptionalAction, default=None,
                       help="openai's half-precision switch: the CPU computes in float32, so "
                       "--fp16 True warns and uses float32 (see --compute-type for int8)")
    group.add_argument("--model-dir", type=Path, default=None, metavar="DIR",
                       help="look --model NAME up here first: DIR/NAME as a CTranslate2 "
                       "directory, or the .pt file openai-whisper downloads for NAME")


def apply(args: argparse.Namespace) -> None:
    """Check the flags; with --model-dir, args.model becomes the file or directory found."""
    from tensorplan.whisper.model_files.find import find_in_dir

    if args.fp16:  # openai's own words when it falls back on a CPU
        print("tensorplan: warning: FP16 is not supported on CPU; using FP32 instead",
              file=sys.stderr)
    if args.model_dir is not None:
        if not args.model_dir.is_dir():
            raise UserError(f"--model-dir {args.model_dir}: no such directory")
        found = find_in_dir(args.model, args.model_dir)
        if found is not None:
            args.model = os.fspath(found)
