"""Where tensorplan's time goes: the encoder against its FLOP floor, the decoder per token.

For each backend and compute type (numpy float32 is the reference; torch float32 and
torch int8 when PyTorch is installed), in one process, on one 30 s window of jfk.wav:

- encoder: median seconds per window (conv + encoder + cross graphs), the window's
  multiply-add count summed over the planned graphs' product nodes, and the floor: that
  count at the rate this machine's best product of the encoder's shape reaches in this
  run (1500 x d times d x 4d; float32 through numpy and PyTorch, int8 through FBGEMM);
- decoder: median ms per token for one sequence and for 5 (beam search), over 32 steps;
- per token: plans made, ndarray views made and the largest Python allocation
  (tracemalloc) while decoding, which must be 0, 0 and far below a tensor's size.

    python bench/speed.py [--model tiny.en] [--repeats 5] [--smoke]
"""

from __future__ import annotations  # noqa: I001

import tensorplan  # noqa: F401 - first: it sets how BLAS and OpenMP threads wait
import argparse
import importlib.util
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
JFK = ROOT / "samples" / "jfk.wav"
STEPS = 32


def median_time(f: Callable[[], Any], repeats: int) -> float:
    f()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        f()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def product_rates(d: int, repeats: int) -> dict[str, float]:
    """Multiply-adds per second of a (1500, d) x (d, 4d) product, the encoder's fc1."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1500, d), dtype=np.float32)
    w = rng.standard_normal((4 * d, d), dtype=np.float32)
    out = np.empty((1500, 4 * d), np.float32)
    macs = 1500 * d * 4 * d
    rates = {"numpy float32": macs / median_time(lambda: np.matmul(a, w.T, out=out), repeats)}
    if importlib.util.find_spec("torch") is not None:
        import torch

        from tensorplan.backends.torch_kernels import pack_int8
        from tensorplan.whisper.planned.quantize import quantize_rows

        ta, tw, to = torch.from_numpy(a), torch.from_numpy(w), torch.from_numpy(out)
        rates["torch float32"] = macs / median_time(
            lambda: torch.matmul(ta, tw.T, out=to), repeats
        )
        q, s = quantize_rows(w)
        packed = pack_int8(torch.from_numpy(q), torch.from_numpy(s))
        rates["fbgemm int8"] = macs / median_time(
            lambda: to.copy_(torch.ops.quantized.linear_dynamic(ta, packed, True)), repeats
        )
    return rates


def window_macs(model: Any) -> int:
    """Multiply-adds of one window: every product node of the conv, encoder and cross
    graphs (matmul, qmatmul, conv2d) counted from its planned shapes."""
    total = 0
    for name in ("conv", "encoder", "cross"):
        for n in model.model.pipeline.stages[name].graph.nodes:
            if n.op is not None and n.op.name in ("matmul", "qmatmul"):
                total += n.size * n.srcs[0].shape[-1]
    return total


def decode_steps(model: Any, n_batch: int, steps: int) -> list[float]:
    """Seconds per step feeding `steps` tokens one at a time to n_batch sequences."""
    tok = model.tokenizer
    inf = model.inference(n_batch)
    seq = np.full((n_batch, 2), [tok.sot, tok.no_timestamps])
    inf.logits(seq)
    times = []
    for i in range(steps):
        seq = np.concatenate([seq, np.full((n_batch, 1), 100 + i)], axis=1)
        t0 = time.perf_counter()
        inf.logits(seq)
        times.append(time.perf_counter() - t0)
    return times


def per_token_checks(model: Any) -> tuple[int, int, int]:
    """(plans made, views made, the most Python memory (numpy's included) one run of a
    decoder graph allocated at once, in bytes) over 8 decode steps. The logits copied
    out for the search (V floats per row) are the step's result, not counted."""
    import tensorplan.alloc.allocator as allocator

    plans: list[Any] = []
    peaks = [0]
    real = allocator.GraphAllocator.alloc_graph
    allocator.GraphAllocator.alloc_graph = lambda self, g: plans.append(g) or real(self, g)
    ex = model.executor
    compute = ex.compute

    def traced(graph: Any) -> None:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        compute(graph)
        peaks[0] = max(peaks[0], tracemalloc.get_traced_memory()[1] - base)

    try:
        decode_steps(model, 1, 2)  # warm: views of every graph used below exist
        views = ex.views_made
        ex.compute = traced
        tracemalloc.start()
        decode_steps(model, 1, 8)
        tracemalloc.stop()
        return len(plans), ex.views_made - views, peaks[0]
    finally:
        allocator.GraphAllocator.alloc_graph = real
        del ex.compute


def configs() -> list[tuple[str, str]]:
    out = [("numpy", "float32")]
    if importlib.util.find_spec("torch") is not None:
        out += [("torch", "float32"), ("torch", "int8")]
    return out


def main(argv: list[str] | None = None) -> int:
    from tensorplan.commands.plan import table
    from tensorplan.whisper.api import load_model
    from tensorplan.whisper.audio.decode import load_audio
    from tensorplan.whisper.audio.mel import log_mel_spectrogram

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny.en")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--smoke", action="store_true", help="one repeat, 4 steps (CI)")
    args = p.parse_args(argv)
    repeats, steps = (1, 4) if args.smoke else (args.repeats, STEPS)

    audio = load_audio(JFK)
    rows = []
    rates: dict[str, float] = {}
    for backend, compute in configs():
        m = load_model(args.model, backend=backend, compute_type=compute).session().state
        if not rates:
            rates = product_rates(m.dims.n_audio_state, repeats)
        mel = np.ascontiguousarray(log_mel_spectrogram(audio, m.dims.n_mels, 480_000)[:, :3000])
        enc_s = median_time(lambda m=m, mel=mel: m.encode(mel), repeats)
        macs = window_macs(m)
        rate = rates["fbgemm int8" if compute == "int8" else f"{backend} float32"]
        per_tok = {b: 1e3 * statistics.median(decode_steps(m, b, steps)) for b in (1, 5)}
        plans, views, peak = per_token_checks(m)
        rows.append([f"{backend} {compute}", f"{enc_s:.3f}", f"{macs / 1e9:.2f}",
                     f"{macs / rate:.3f}", f"{enc_s * rate / macs:.2f}",
                     f"{per_tok[1]:.2f}", f"{per_tok[5]:.2f}",
                     f"{plans} / {views} / {peak / 1024:.0f} KiB"])
        del m
    print(f"{args.model}, one 30 s window of jfk.wav; medians of {repeats} (encoder), "
          f"{steps} steps (decoder)")
    print("product rates this run (GMAC/s, 1500 x d x 4d): "
          + ", ".join(f"{k} {v / 1e9:.0f}" for k, v in rates.items()))
    print(table(["backend", "encoder s", "GMAC", "floor s", "x floor", "ms/token b1",
                 "ms/step b5", "per token: plans / views / Python alloc"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
