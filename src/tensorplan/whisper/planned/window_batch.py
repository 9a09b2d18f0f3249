"""The graphs that decode W windows at once (batched transcription), planned once per shape.

A `WindowBatch` holds W windows' cross-attention K/V side by side, (W, H, A, dh) per layer,
and a self-attention KV cache for W*G sequences (G: beams or 1), with sequence s of
window s // G. Each window is encoded by the model's one-window graphs and its cross K/V
copied into its slot (the encoder's products are already at their FLOP floor for one
window; the decoder is where a batch pays: W*G rows share each weight read per step).

Decoder graphs: a prompt graph (PROMPT_TOKENS new tokens per sequence) and step graphs,
one per context bucket: a step at position p reads only the first bucket >= p + 1 cache
rows of each sequence, so the self-attention costs what the text so far needs, not 448.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.backends.base import TemplateBuffer, TemplateBufferType, templates_of
from tensorplan.graph import Graph
from tensorplan.pipeline import Pipeline
from tensorplan.tensor import Tensor
from tensorplan.whisper.model_files.ct2_weights import ModelDims as Dims
from tensorplan.whisper.planned import graphs
from tensorplan.whisper.planned.compute_weights import ComputeWeights

PROMPT_TOKENS = 4  # sot, language, task, no-timestamps: the whole prompt in one pass
CONTEXT_BUCKETS = (32, 64, 128, 256)  # cache rows a step reads; the last bucket is n_text_ctx


@dataclass(frozen=True)
class BatchDecoder:
    n_kv: int  # cache rows read per sequence
    n_tok: int
    inputs: graphs.DecoderInputs
    logits: Tensor  # (rows, V)
    graph_name: str


@dataclass(frozen=True)
class BatchGraphs:
    """The decoder graphs of the first n_windows windows of a batch (a prefix of its
    slots: a partial batch, or the windows still decoding once others finished)."""

    n_windows: int
    n_seq: int
    prompt: BatchDecoder
    steps: tuple[BatchDecoder, ...]  # by increasing n_kv

    def step(self, n_ctx: int) -> BatchDecoder:
        """The step graph that reads at least n_ctx cache rows per sequence."""
        return next(g for g in self.steps if g.n_kv >= n_ctx)


@dataclass(frozen=True, eq=False)  # one per planned shape: compared (and hashed) by identity
class WindowBatch:
    n_windows: int
    n_group: int  # sequences per window
    kv_cross: tuple[tuple[Tensor, Tensor], ...]  # per layer (W, H, A, dh) K and V
    slots: tuple[tuple[tuple[Tensor, Tensor], ...], ...]  # [window][layer] (H, A, dh) views
    kv_self: tuple[tuple[Tensor, Tensor], ...]  # per layer (W*G*T, d) K and V
    sizes: tuple[BatchGraphs, ...]  # by increasing n_windows, the last all W
    pipeline: Pipeline
    buffers: tuple[TemplateBuffer, ...]  # what a session binds for this batch

    @property
    def n_seq(self) -> int:
        return self.n_windows * self.n_group

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def for_windows(self, n: int) -> BatchGraphs:
        """The graphs of the smallest planned prefix that holds n windows."""
        return next(g for g in self.sizes if g.n_windows >= n)

    def graph(self, g: BatchDecoder) -> Graph:
        return self.pipeline.stages[g.graph_name].graph


def prefix_sizes(n_windows: int) -> list[int]:
    """Window counts planned for a batch of n: the powers of two below it, and n."""
    return sorted({1 << i for i in range(n_windows.bit_length()) if 1 << i < n_windows}
                  | {n_windows})


def plan_window_batch(param: ComputeWeights, dims: Dims, templates: TemplateBufferType,
                      n_windows: int, n_group: int, *, kv_dtype: str, plan: str,
                      strategy: str, known: set[TemplateBuffer]) -> WindowBatch:
    """Build and plan the graphs of a batch of n_windows windows x n_group sequences, and
    of its prefixes (prefix_sizes), all over the same caches and one compute arena;
    `known`: template buffers sessions already bind (the model's), not counted again."""
    d, n_audio, t_ctx = dims.n_text_state, dims.n_audio_ctx, dims.n_text_ctx
    kv = dt.dtype(kv_dtype)
    make = templates.persistent
    n_seq = n_windows * n_group
    n_head = dims.n_text_head
    head_major = (n_head, n_audio, d // n_head)  # as the model's cross K/V (graphs.build_cross)
    cross = tuple((make((n_windows, *head_major), kv, f"batch.cross_k{i}"),
                   make((n_windows, *head_major), kv, f"batch.cross_v{i}"))
                  for i in range(dims.n_text_layer))
    window = n_audio * d * kv.itemsize
    slots = tuple(tuple((ops.view(k, head_major, offset=w * window),
                         ops.view(v, head_major, offset=w * window))
                        for k, v in cross) for w in range(n_windows))
    kv_self = tuple((make((n_seq * t_ctx, d), kv, f"batch.kv_self.k{i}"),
                     make((n_seq * t_ctx, d), kv, f"batch.kv_self.v{i}"))
                    for i in range(dims.n_text_layer))
    pipe = Pipeline(templates, plan, strategy)
    buckets = sorted({b for b in CONTEXT_BUCKETS if b < t_ctx} | {t_ctx})

    def add(name: str, n_win: int, n_tok: int, n_rows: int, n_kv: int) -> BatchDecoder:
        inp = graphs.decoder_inputs(n_win * n_group, n_tok, n_rows, n_kv)
        refs = [(ops.view(k, (n_win, *head_major)), ops.view(v, (n_win, *head_major)))
                for k, v in cross]  # the first n_win windows
        logits = graphs.build_decoder(param, dims, inp, n_win * n_group, n_tok, list(kv_self),
                                      refs, n_windows=n_win)
        pipe.add(name, [logits], group="batch_decoder", joint=False)
        return BatchDecoder(n_kv, n_tok, inp, logits, name)

    sizes = []
    for w in prefix_sizes(n_windows):
        # the prompt's logits: at the sot and the last position of one sequence per window
        prompt = add(f"batch_prompt[w{w}]", w, PROMPT_TOKENS, 2 * w, t_ctx)
        steps = tuple(add(f"batch_step[w{w},k{b}]", w, 1, w * n_group, b) for b in buckets)
        sizes.append(BatchGraphs(w, w * n_group, prompt, steps))
    pipe.allocate()
    tensors = [t for s in pipe.stages.values() for t in (*s.graph.nodes, *s.graph.leafs)]
    tensors += [t for pair in (*cross, *kv_self) for t in pair]
    own = tuple(b for b in templates_of(tensors) if b not in known)
    return WindowBatch(n_windows, n_group, cross, slots, kv_self, tuple(sizes), pipe, own)
