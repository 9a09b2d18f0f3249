"""The device backend on one device: op correctness against numpy, then Whisper speed
against openai-whisper and HF transformers on the same dimensions, random weights.

    python bench/gpu.py --device cuda                        # the GPU run (a few minutes)
    python bench/gpu.py --device cpu --dims tiny --repeats 1 --tokens 4   # proves it on CPU

1. Every case of the backend op table (tests/backends/backend_cases.py) on random
   inputs, the device backend against the numpy one: ||out - ref|| / ||ref|| <= 1e-5 for
   float32 cases, <= 1e-3 for cases with float16 operands (one float16 rounding of each
   result, 2^-11, plus the float32 work before it), and the same matrix product with
   float16-stored weights (what cuda loads) <= 2e-3 (float16 weights and activations in
   the product: a few 2^-11 roundings summed over K in float32).
2. Per model dims (random weights from --seed, no files): encoder ms per 30 s window and
   decoder ms per token at each --batch, the device backend eager and with graph capture
   (CUDA graphs; on the CPU the recording stand-in, which only proves the path), then
   openai-whisper's `Whisper(ModelDimensions(...))` and transformers'
   `WhisperForConditionalGeneration` (sdpa) on the same dims, fp16 on cuda, when
   installed (skipped with the reason otherwise). A table of times and ratios follows.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "backends"))  # the op table the tests run

from tensorplan.backends import NumpyBackend  # noqa: E402
from tensorplan.backends.capture import RecordingCapturer  # noqa: E402
from tensorplan.backends.torch_device import DeviceBackend  # noqa: E402
from tensorplan.whisper.model_files.random_weights import (  # noqa: E402
    DIMS,
    RandomTokenizer,
    RandomWeights,
)
from tensorplan.whisper.planned.model import WhisperModel  # noqa: E402
from tensorplan.whisper.planned.session import WhisperSession  # noqa: E402

F32_BOUND, F16_BOUND, NARROW_BOUND = 1e-5, 1e-3, 2e-3
SOT = 50258


# ---- 1. correctness ----------------------------------------------------------------------
def rel(got: np.ndarray, ref: np.ndarray) -> float:
    g, r = got.astype(np.float64), ref.astype(np.float64)
    finite = np.isfinite(r)
    if not np.array_equal(np.isfinite(g), finite):
        return float("inf")
    return float(np.linalg.norm((g - r)[finite]) / max(np.linalg.norm(r[finite]), 1e-300))


def check_ops(device: str) -> bool:
    from backend_cases import CASES, run_case

    torch.backends.cudnn.allow_tf32 = False  # fp32 convolutions as fp32 (the default is TF32)
    worst: dict[str, tuple[float, str]] = {}
    ok = True
    for case in CASES:
        ref, _ = run_case(NumpyBackend(), case, seed=1)
        got, _ = run_case(DeviceBackend(device), case, seed=1)
        narrow = any(a.dtype == "float16" for a in case.args) or ref.dtype == np.float16
        bound = F16_BOUND if narrow else F32_BOUND
        err = 0.0 if ref.dtype.kind in "iu" and np.array_equal(got, ref) else rel(got, ref)
        kind = "float16" if narrow else str(ref.dtype)
        if err > worst.get(kind, (-1.0, ""))[0]:
            worst[kind] = (err, case.id)
        if err > bound:
            ok = False
            print(f"  FAIL {case.id}: {err:.3g} > {bound:g}")
    err = narrowed_product(device)
    worst["float16 weights"] = (err, "linear 64x512 @ 512x512")
    ok &= err <= NARROW_BOUND
    print(f"op table: {len(CASES)} cases on {device}, {'all within bounds' if ok else 'FAILED'}")
    for kind, (e, cid) in sorted(worst.items()):
        print(f"  worst {kind}: {e:.2e} ({cid})")
    return ok


def narrowed_product(device: str) -> float:
    from backend_cases import place_all

    from tensorplan import ops
    from tensorplan.graph import Graph

    rng = np.random.default_rng(0)
    x_val = rng.standard_normal((64, 512)).astype(np.float32)
    w_val = (rng.standard_normal((512, 512)) * 0.05).astype(np.float32)
    outs = []
    for backend in (NumpyBackend(), DeviceBackend(device, weights_dtype="float16")):
        x = ops.input((64, 512))
        y = ops.linear(x, backend.param(w_val))
        g = Graph.build(y)
        place_all(g, backend)
        backend.set(x, x_val)
        backend.compute(g)
        outs.append(np.asarray(backend.get(y)))
    return rel(outs[1], outs[0])


# ---- 2. speed ---------------------------------------------------------------------------
def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str, repeats: int) -> float:
    """Median ms of fn over `repeats` runs, after one warm-up run."""
    fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t) * 1000)
    return statistics.median(times)


def decode_ms(step: Callable[[int], Any], n_tokens: int, device: str, repeats: int) -> float:
    """ms per token of `step(i)` for i in 1..n_tokens (after step(0), the prompt)."""

    def run() -> None:
        step(0)
        for i in range(1, n_tokens + 1):
            step(i)

    return timed(run, device, repeats) / (n_tokens + 1)


def encoder_and_decoder_ms(encode: Callable[[], Any],
                           decoder_step: Callable[[int, Any], Callable[[int], Any]],
                           args: argparse.Namespace) -> dict[str, float]:
    """ms of encode(), then for each batch size b ms per token of decoder_step(b, enc)'s
    step (enc: encode()'s result, for the cross-attention)."""
    out = {"encoder": timed(encode, args.device, args.repeats)}
    enc = encode()
    for b in args.batch:
        out[f"decoder b{b}"] = decode_ms(decoder_step(b, enc), args.tokens, args.device,
                                         args.repeats)
    return out


def ours(dims_name: str, args: argparse.Namespace, graphs: bool) -> dict[str, float]:
    device, dims = args.device, DIMS[dims_name]
    capturer = RecordingCapturer() if graphs and device == "cpu" else None
    backend = DeviceBackend(device, weights_dtype="float16" if device == "cuda" else None,
                            cuda_graphs=graphs and device == "cuda", capturer=capturer)
    w = RandomWeights(dims, args.seed)
    model = WhisperModel(w, RandomTokenizer(), w.config, backend=backend,
                         max_batch=max(args.batch))
    session = WhisperSession(model)
    mel = np.random.default_rng(args.seed).standard_normal((dims.n_mels, 3000), np.float32)

    def decoder_step(b: int, _enc: Any) -> Callable[[int], None]:
        state: dict[str, Any] = {}  # the session holds the encoder's output itself

        def step(i: int) -> None:
            if i == 0:
                state["inf"] = session.inference(b)
                state["tok"] = np.full((b, 1), SOT)
            else:
                state["tok"] = np.concatenate([state["tok"], np.full((b, 1), 220 + i)], 1)
            state["inf"].logits(state["tok"])  # logits rows back on the host, as decoding

        return step

    return encoder_and_decoder_ms(lambda: session.encode(mel), decoder_step, args)


def openai_whisper(dims_name: str, args: argparse.Namespace) -> dict[str, float] | str:
    try:
        from whisper.model import ModelDimensions, Whisper
    except ImportError as e:
        return f"openai-whisper not installed ({e})"
    device, d = args.device, DIMS[dims_name]
    dtype = torch.float16 if device == "cuda" else torch.float32
    torch.manual_seed(args.seed)
    model = Whisper(ModelDimensions(**dataclasses.asdict(d))).to(device, dtype).eval()
    mel = torch.randn(1, d.n_mels, 3000, device=device, dtype=dtype)

    def decoder_step(b: int, enc: Any) -> Callable[[int], None]:
        feats = enc.repeat(b, 1, 1)
        state: dict[str, Any] = {}

        def step(i: int) -> None:
            if i == 0:
                if "hooks" in state:
                    for h in state["hooks"]:
                        h.remove()
                state["cache"], state["hooks"] = model.install_kv_cache_hooks()
                state["cache"].clear()
                tok = torch.full((b, 1), SOT, device=device)
                state["tok"] = tok
            else:
                tok = torch.full((b, 1), 220 + i, device=device)
                state["tok"] = torch.cat([state["tok"], tok], 1)
            logits = model.decoder(tok, feats, kv_cache=state["cache"])
            logits[:, -1].float().cpu()

        return step

    with torch.inference_mode():
        return encoder_and_decoder_ms(lambda: model.encoder(mel), decoder_step, args)


def hf_whisper(dims_name: str, args: argparse.Namespace) -> dict[str, float] | str:
    try:
        from transformers import WhisperConfig, WhisperForConditionalGeneration
    except ImportError as e:
        return f"transformers not installed ({e})"
    device, d = args.device, DIMS[dims_name]
    dtype = torch.float16 if device == "cuda" else torch.float32
    cfg = WhisperConfig(vocab_size=d.n_vocab, num_mel_bins=d.n_mels, d_model=d.n_audio_state,
                        encoder_layers=d.n_audio_layer, encoder_attention_heads=d.n_audio_head,
                        decoder_layers=d.n_text_layer, decoder_attention_heads=d.n_text_head,
                        encoder_ffn_dim=4 * d.n_audio_state, decoder_ffn_dim=4 * d.n_text_state,
                        max_source_positions=d.n_audio_ctx, max_target_positions=d.n_text_ctx)
    torch.manual_seed(args.seed)
    model = WhisperForConditionalGeneration._from_config(cfg, attn_implementation="sdpa")
    model = model.to(device, dtype).eval()
    feats_in = torch.randn(1, d.n_mels, 3000, device=device, dtype=dtype)
    enc_fn = model.get_encoder()

    def decoder_step(b: int, enc: Any) -> Callable[[int], None]:
        feats = enc.repeat(b, 1, 1)
        state: dict[str, Any] = {}

        def step(i: int) -> None:
            tok = torch.full((b, 1), SOT if i == 0 else 220 + i, device=device)
            r = model(encoder_outputs=(feats,), decoder_input_ids=tok, use_cache=True,
                      past_key_values=None if i == 0 else state["past"])
            state["past"] = r.past_key_values
            r.logits[:, -1].float().cpu()

        return step

    with torch.inference_mode():
        return encoder_and_decoder_ms(lambda: enc_fn(feats_in).last_hidden_state, decoder_step,
                                      args)


def table(results: dict[str, dict[str, dict[str, float] | str]]) -> None:
    print("\n| dims | what | tensorplan eager ms | tensorplan graphs ms | openai-whisper ms "
          "| transformers ms | graphs / openai | graphs / transformers |")
    print("|---|---|---|---|---|---|---|---|")
    for dims_name, by in results.items():
        eager, graphs = by["eager"], by["graphs"]
        assert isinstance(eager, dict) and isinstance(graphs, dict)
        for what in eager:
            cells = [f"{eager[what]:.2f}", f"{graphs[what]:.2f}"]
            ratios = []
            for peer in ("openai", "hf"):
                p = by[peer]
                cells.append(f"{p[what]:.2f}" if isinstance(p, dict) else "skipped")
                ratios.append(f"{graphs[what] / p[what]:.2f}" if isinstance(p, dict) else "-")
            print(f"| {dims_name} | {what} | " + " | ".join(cells + ratios) + " |")
    for dims_name, by in results.items():
        for peer in ("openai", "hf"):
            if isinstance(by[peer], str):
                print(f"{dims_name} {peer}: skipped: {by[peer]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--dims", default="tiny,base,small,large-v3",
                    help=f"comma-separated, of {', '.join(DIMS)}")
    ap.add_argument("--batch", default="1,5", help="decoder batch sizes, comma-separated")
    ap.add_argument("--tokens", type=int, default=32, help="decoder steps timed per run")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-peers", action="store_true")
    args = ap.parse_args()
    args.batch = [int(b) for b in args.batch.split(",")]
    from tensorplan.backends.torch_device import torch_device

    torch_device(args.device)  # UserError here if there is no such device
    if args.device == "cuda":
        print(f"device: {torch.cuda.get_device_name()} (torch {torch.__version__})")
    ok = check_ops(args.device)
    results: dict[str, dict[str, dict[str, float] | str]] = {}
    for name in args.dims.split(","):
        print(f"{name}: timing ...", flush=True)
        skip = "--no-peers"
        results[name] = {
            "eager": ours(name, args, graphs=False),
            "graphs": ours(name, args, graphs=True),
            "openai": skip if args.no_peers else openai_whisper(name, args),
            "hf": skip if args.no_peers else hf_whisper(name, args),
        }
        if args.device == "cuda":
            torch.cuda.empty_cache()
    table(results)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
