"""Would batching encoder windows pay on the torch CPU backend? The kernels that could share
work between windows, timed at B windows stacked against B windows one at a time.

Batching B encoder windows can only speed up the products whose weight is shared between
the windows: the linear layers (qkv, out, fc1, fc2) and the two convolutions (run as
products over im2col columns), whose rows grow from A = 1500 to B x 1500. Self-attention
(scores, softmax, weighted values) is per window: B windows cost B times one. So this
times those products, with the backend's own kernels (`torch_kernels.matmul` for float32,
`qmatmul` over FBGEMM's packed int8 for int8), at a model's shapes:

    python bench/encoder_batch.py [--model-dims tiny] [--batches 1,2,4,8] [--repeats 15]

Reported per shape: ms per window (median of --repeats, each timing B windows in one
call), and that as a ratio of B = 1. A ratio near 1.0 means batching saves nothing there.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

# (d, conv input channels): the encoder's product shapes follow from these
DIMS = {"tiny": (384, 80), "base": (512, 80), "small": (768, 80)}
A = 1500  # audio positions per window (the second conv's output rows)


def shapes(d: int, mels: int) -> dict[str, tuple[int, int, int]]:
    """name: (rows per window, k, n) of each weight-sharing product of one encoder layer
    (conv1 runs on 2A rows of 3 x mels columns; conv2 on A rows of 3 x d)."""
    return {"conv1": (2 * A, 3 * mels, d), "conv2": (A, 3 * d, d), "qkv": (A, d, 3 * d),
            "out": (A, d, d), "fc1": (A, d, 4 * d), "fc2": (A, 4 * d, d)}


def time_product(torch: object, kernel: object, params: dict, rows: int, k: int, n: int,
                 weight: object, repeats: int) -> float:
    t = torch  # type: ignore[assignment]
    a = t.randn(rows, k)  # type: ignore[attr-defined]
    out = t.empty(rows, n)  # type: ignore[attr-defined]
    srcs = [a, weight]
    for _ in range(2):
        kernel(out, srcs, params)  # type: ignore[operator]
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel(out, srcs, params)  # type: ignore[operator]
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model-dims", default="tiny", choices=sorted(DIMS))
    ap.add_argument("--batches", default="1,2,4,8")
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    import torch

    from tensorplan.backends import torch_kernels

    torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",")]
    d, mels = DIMS[args.model_dims]
    print(f"{args.model_dims}: torch {torch.__version__}, {args.threads} threads, "
          f"ms per window (ratio to B=1)")
    print("| product | compute | " + " | ".join(f"B={b}" for b in batches) + " |")
    print("|---|---|" + "---:|" * len(batches))
    totals = {c: [0.0] * len(batches) for c in ("float32", "int8")}
    for name, (rows, k, n) in shapes(d, mels).items():
        w = torch.randn(n, k) / k**0.5
        scale = w.abs().amax(dim=1) / 127
        q = torch.round(w / scale[:, None]).to(torch.int8)
        kernels = {"float32": (torch_kernels.matmul, {"transpose_b": True}, w),
                   "int8": (torch_kernels.qmatmul,
                            {"_packed": torch_kernels.pack_int8(q, scale)}, None)}
        for compute, (kernel, params, weight) in kernels.items():
            per = [time_product(torch, kernel, params, rows * b, k, n, weight, args.repeats) / b
                   for b in batches]
            for i, p in enumerate(per):
                totals[compute][i] += p
            cells = " | ".join(f"{p * 1e3:.2f} ({p / per[0]:.2f})" for p in per)
            print(f"| {name} | {compute} | {cells} |")
    for compute, per in totals.items():
        cells = " | ".join(f"{p * 1e3:.2f} ({p / per[0]:.2f})" for p in per)
        print(f"| **one layer's products, conv once** | {compute} | {cells} |")


if __name__ == "__main__":
    main()
