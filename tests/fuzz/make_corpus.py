"""Regenerate the seed corpus: `python tests/fuzz/make_corpus.py` (deterministic).

Every seed is synthetic and small: model.bin files from ct2_writer (not the 75 MB tiny.en),
minimal byte-level BPE tokenizers, short traces, and a few hundred milliseconds of audio in
several containers. Each harness's folder stays under 100 KB. Inputs that once crashed a
harness are kept beside the seeds as `crash-*` files (regression tests), never regenerated.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "whisper"), str(HERE.parent / "robustness")]

import ct2_writer as w  # noqa: E402
from synth_audio import encoded, pcm16, pcm24, tone, wav  # noqa: E402

from tensorplan.whisper.tokenizer import _BYTE_DECODER  # noqa: E402

CORPUS = HERE / "corpus"


def model_bin_seeds() -> dict[str, bytes]:
    seeds = {}
    # a complete Whisper the engine could run (80 mels, 1500 positions), as small as it gets
    runnable = w.whisper_arrays(d=2, heads=1, audio_layers=1, text_layers=1, vocab=5,
                                text_ctx=3)
    aliases = [("decoder/projection/weight", "decoder/embeddings/weight")]
    seeds["whisper-v6-f16.bin"] = w.model_bin([w.Var(k, a) for k, a in runnable.items()],
                                              aliases)
    small = w.whisper_arrays(d=2, heads=1, audio_layers=1, text_layers=1, vocab=5, n_mels=4,
                             audio_ctx=3, text_ctx=3, dtype="float32")
    for version in (1, 2, 3, 4, 5):
        variables = [w.Var(k, a) for k, a in small.items()
                     if version >= 4 or a.dtype != np.int8 or a.ndim > 0]
        if version < 3:
            variables.append(w.Var("decoder/projection/weight",
                                   small["decoder/embeddings/weight"]))
        seeds[f"whisper-v{version}-small-dims.bin"] = w.model_bin(
            variables, aliases if version >= 3 else [], version)
    q = np.array([[1, -2, 3], [4, 5, -6]], np.int8)
    seeds["quantized.bin"] = w.model_bin([
        w.Var("a/weight", q), w.Var("a/weight_scale", np.array([2.0, 4.0], np.float32)),
        w.Var("b/weight", q.astype(np.int16)), w.Var("c", np.array([0x3F80], np.uint16),
                                                     dtype_id=5),
        w.Var("n", np.array(6, np.int32))], [("d/weight", "a/weight")])
    seeds["other-spec.bin"] = w.model_bin([w.Var("x", np.zeros(3, np.float16))],
                                          spec="TransformerSpec", revision=7)
    return seeds


def _gpt2_bytes() -> list[str]:
    by_byte = {b: c for c, b in _BYTE_DECODER.items()}
    return [by_byte[b] for b in range(256)]


def _tokenizer(multilingual: bool, pair_merges: bool) -> bytes:
    chars = _gpt2_bytes()
    merged = ["Ġ t", "h e", "Ġt he", "Ġ a", "i n", "Ġ w", "o r", "Ġ o"]
    vocab = {c: i for i, c in enumerate(chars)}
    for m in merged:
        vocab.setdefault(m.replace(" ", ""), len(vocab))
    specials = ["<|startoftranscript|>"]
    if multilingual:
        specials += ["<|en|>", "<|de|>", "<|iw|>", "<|translate|>", "<|transcribe|>"]
    specials += ["<|startoflm|>", "<|startofprev|>", "<|nospeech|>", "<|notimestamps|>"]
    added = []
    if multilingual:
        specials.insert(0, "<|endoftext|>")
    else:
        vocab["<|endoftext|>"] = len(vocab)  # GPT-2's English BPE ranks it last
        added.append(vocab["<|endoftext|>"])
    first = len(vocab)
    spec = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": t, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, t in [(n, "<|endoftext|>") for n in added]
                         + list(enumerate(specials, first))],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False,
                          "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": "", "end_of_word_suffix": "",
                  "fuse_unk": False, "byte_fallback": False, "vocab": vocab,
                  "merges": [m.split(" ") for m in merged] if pair_merges else merged},
    }
    return json.dumps(spec, ensure_ascii=False, separators=(",", ":")).encode()


def tokenizer_seeds() -> dict[str, bytes]:
    return {
        "english.json": _tokenizer(multilingual=False, pair_merges=False),
        "multilingual-pair-merges.json": _tokenizer(multilingual=True, pair_merges=True),
    }


def trace_seeds() -> dict[str, bytes]:
    return {
        "small.csv": b"id,lower,upper,size\na,0,3,10\nb,1,2,0\nc,2,5,7\nd,4,6,10\n",
        "reordered-quoted.csv": b'size,upper,id,lower\r\n64,9,"x,1",0\r\n32,4,y,3\r\n',
        "bom-spaces-blank.csv": "\ufeff id , lower , upper , size \n\n t0 , -5 , 5 , 1 \n"
                                .encode(),
        "big-values.csv": b"id,lower,upper,size\nA,-9223372036854775808,9223372036854775807,"
                          b"1099511627776\nB,0,1,+0\n",
        "extra-columns.csv": b"id,lower,upper,size,note\nq,0,1,1,hello\nr,1,2,2,\n",
    }


def audio_seeds() -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    return {
        "pcm16.wav": wav(pcm16(tone(0.1))),
        "float32-stereo.wav": wav(tone(0.05, channels=2).astype("<f4"), channels=2, bits=32,
                                  fmt_tag=3),
        "pcm24-8k.wav": wav(pcm24(tone(0.1, 8000)), 8000, bits=24),
        "pcm8-22k.wav": wav((rng.integers(100, 156, 2205)).astype(np.uint8), 22050, bits=8),
        "tone.flac": encoded("flac", "flac", 0.25),
        "tone.mp3": encoded("libmp3lame", "mp3", 0.25),
        "tone.ogg": encoded("libopus", "ogg", 0.25),
    }


def main() -> None:
    for name, seeds in (("model_bin", model_bin_seeds()), ("tokenizer", tokenizer_seeds()),
                        ("trace", trace_seeds()), ("audio", audio_seeds())):
        folder = CORPUS / name
        folder.mkdir(parents=True, exist_ok=True)
        for old in folder.iterdir():
            if not old.name.startswith("crash-"):  # inputs that once crashed stay
                old.unlink()
        for file, data in seeds.items():
            (folder / file).write_bytes(data)
        total = sum(f.stat().st_size for f in folder.iterdir())
        assert total < 100_000, f"{name}: {total} bytes of seeds"
        print(f"{name}: {len(seeds)} seeds, {total} bytes")


if __name__ == "__main__":
    main()
