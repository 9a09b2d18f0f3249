"""A loaded Whisper model: weights in compute form, and every graph built and planned once.

`WhisperModel` is immutable after construction and shared by every session (session.py):
its graphs are planned against template buffers (backends/base.py), which each session
binds to memory of its own, so N sessions cost N arenas and KV caches, never N copies of
the weights or N plans. Graphs per window: conv, encoder, cross (the cross-attention K/V);
per token: a decoder graph for each (batch, tokens, logits rows) shape decoding uses; for
word timestamps: teacher-forced alignment passes and their logits heads.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from tensorplan import dtype as dt
from tensorplan import ops
from tensorplan.backends.base import Backend, TemplateBufferType, templates_of
from tensorplan.graph import Graph
from tensorplan.pipeline import Pipeline
from tensorplan.tensor import Tensor
from tensorplan.whisper.limits import check_batch_budget
from tensorplan.whisper.model_files.ct2_weights import ModelDims as Dims
from tensorplan.whisper.model_files.ct2_weights import WhisperConfig
from tensorplan.whisper.planned import graphs
from tensorplan.whisper.planned.compute_weights import WEIGHT_DTYPES, ComputeWeights, StoredWeights
from tensorplan.whisper.planned.window_batch import WindowBatch, plan_window_batch
from tensorplan.whisper.tokenizer import Tokenizer

log = logging.getLogger("tensorplan.whisper")

# Decoder graphs that feed several tokens at once. Longer prompts go in chunks of the
# largest: the KV cache makes chunked feeding exact, and the worst-case graph (its
# (H, N, 1500) cross-attention scores above all) stays small.
PROMPT_BUCKETS = (4, 16, 64)
HEAD_ROWS = 32  # logits rows per run of an alignment head graph
KV_DTYPES = ("float32", "float16")


@dataclass(frozen=True)
class DecoderGraph:
    n_batch: int
    n_tok: int
    n_rows: int
    inputs: graphs.DecoderInputs
    logits: Tensor
    graph: Graph


@dataclass(frozen=True)
class AlignGraph:
    """A teacher-forced decoder pass that keeps the alignment heads' cross-attention,
    and the graph that turns its hidden states into logits, HEAD_ROWS rows at a time."""

    n_tok: int
    inputs: graphs.DecoderInputs
    heads: tuple[Tensor, ...]  # per alignment head (N, A) pre-softmax QK^T * scale, OUTPUT
    graph: Graph
    head_rows: Tensor  # (HEAD_ROWS,) INPUT of the logits head graph
    logits: Tensor  # (HEAD_ROWS, V)
    head_graph: Graph


class WhisperModel:
    """One model on one backend, planned once per graph shape; read-only once built."""

    def __init__(self, weights: StoredWeights, tokenizer: Tokenizer, config: WhisperConfig, *,
                 backend: Backend,
                 plan: str = "joint", strategy: str = "offline", max_batch: int = 5,
                 kv_dtype: str = "float32", weights_dtype: str = "float32",
                 compute_type: str = "float32",
                 cached_weights: Mapping[str, np.ndarray] | None = None,
                 _narrowing: tuple[WhisperModel, int] | None = None) -> None:
        if kv_dtype not in KV_DTYPES or weights_dtype not in WEIGHT_DTYPES:
            raise ValueError("kv_dtype and weights_dtype must be float32 or float16")
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1, got {max_batch}")
        self.tokenizer, self.config = tokenizer, config
        self.dims: Dims = weights.dims
        self.is_multilingual = bool(getattr(tokenizer, "is_multilingual", False))
        self.backend = backend
        self.plan_mode, self.strategy, self.max_batch = plan, strategy, max_batch
        self.kv_dtype, self.weights_dtype, self.compute_type = kv_dtype, weights_dtype, compute_type
        if _narrowing is None:
            self.param = ComputeWeights(weights, backend, compute_type=compute_type,
                                        weights_dtype=weights_dtype, cached=cached_weights)
            self.templates = TemplateBufferType(backend.buffer_type)
            self.kv_self = self._make_kv_self(max_batch)
        else:  # the same weights (their PARAM tensors) and self-attention caches
            wide, n_audio_ctx = _narrowing
            self.dims = dataclasses.replace(self.dims, n_audio_ctx=n_audio_ctx)
            self.param, self.templates, self.kv_self = wide.param, wide.templates, wide.kv_self
        self.pipeline = Pipeline(self.templates, plan, strategy)
        self._build_window_graphs()
        self.decoders: dict[tuple[int, int, int], DecoderGraph] = {}
        self._build_decoders()
        self.aligners = {n: self._add_align(n) for n in PROMPT_BUCKETS}
        self.pipeline.allocate()
        # what a session binds at once, and what only its first word alignment binds
        self.session_buffers = templates_of(self._tensors(align=False))
        self.align_buffers = tuple(b for b in templates_of(self._tensors(align=True))
                                   if b not in self.session_buffers)
        log.debug("planned compute bytes: %s", self.pipeline.compute_bytes())
        # batched transcription's graphs, planned on first use of a shape (window_batch.py)
        self._window_batches: dict[tuple[int, int], WindowBatch] = {}
        self._narrowed: dict[int, WhisperModel] = {}
        self._planning = threading.Lock()

    def narrowed(self, n_audio_ctx: int) -> WhisperModel:
        """This model over shorter windows: n_audio_ctx encoder positions (2 mel frames,
        20 ms each) instead of 1500, whisper.cpp's `audio_ctx`. The encoder's work shrinks
        with the window (its attention quadratically) and so do the decoder's cross K/V,
        for audio far shorter than 30 s, where the full window is mostly padding; Whisper
        was trained on 30 s windows only, so what this costs in accuracy is measured per
        use (docs/realtime.md). Same weights (their very PARAM tensors: no copy, no second
        packing) and self-attention caches (a session binds those once for both); graphs
        of its own, planned on first use under the planning lock."""
        if n_audio_ctx == self.dims.n_audio_ctx:
            return self
        if not 0 < n_audio_ctx < self.dims.n_audio_ctx:
            raise ValueError(f"a narrowed window needs 1 to {self.dims.n_audio_ctx - 1} "
                             f"positions, got {n_audio_ctx}")
        with self._planning:
            model = self._narrowed.get(n_audio_ctx)
            if model is None:
                model = WhisperModel(
                    self.param.stored, self.tokenizer, self.config, backend=self.backend,
                    plan=self.plan_mode, strategy=self.strategy, max_batch=self.max_batch,
                    kv_dtype=self.kv_dtype, weights_dtype=self.weights_dtype,
                    compute_type=self.compute_type, _narrowing=(self, n_audio_ctx))
                self._narrowed[n_audio_ctx] = model
            return model

    @property
    def session_bytes(self) -> int:
        """Bytes one session holds: its arenas and caches (the weights are shared); word
        timestamps add `align_bytes` on first use."""
        return sum(b.size for b in self.session_buffers)

    @property
    def align_bytes(self) -> int:
        return sum(b.size for b in self.align_buffers)

    @property
    def window_store_bytes(self) -> int:
        """Bytes of one window's cross-attention K/V, as a step engine parks it for each
        admitted stream between its decodings."""
        return sum(math.prod(t.shape) * t.dtype.itemsize for pair in self.kv_cross
                   for t in pair)

    def engine_bytes(self, windows: int, groups: Iterable[int]) -> int:
        """Bytes a step engine of `windows` windows holds once it has made the batches of
        these group sizes and aligned words: its session with the alignment graphs' own
        buffers, a window store per window, and each batch as the planner laid it out
        (planned here if need be; nothing is allocated), and the encoder's session where it
        encodes on a thread of its own (step_engine.encodes_aside)."""
        from tensorplan.whisper.planned.step_engine import encodes_aside

        sessions = 2 if encodes_aside(self) else 1  # the encoder's own, where it has one
        return (sessions * self.session_bytes + self.align_bytes
                + windows * self.window_store_bytes
                + sum(self.window_batch(windows, g).nbytes for g in set(groups)))

    def _tensors(self, align: bool) -> list[Tensor]:
        stages = [s for s in self.pipeline.stages.values()
                  if s.name.startswith("align") == align]
        every = [t for s in stages for t in (*s.graph.nodes, *s.graph.leafs)]
        return every + [t for pair in self.kv_self for t in pair] + self.pipeline.persistent

    def _make_kv_self(self, n_batch: int) -> list[tuple[Tensor, Tensor]]:
        rows, d = n_batch * self.dims.n_text_ctx, self.dims.n_text_state
        kv = dt.dtype(self.kv_dtype)
        make = self.templates.persistent
        return [(make((rows, d), kv, f"kv_self.k{i}"), make((rows, d), kv, f"kv_self.v{i}"))
                for i in range(self.dims.n_text_layer)]

    # ---- graphs -------------------------------------------------------------------------
    def _build_window_graphs(self) -> None:
        p, dims, pipe = self.param, self.dims, self.pipeline
        persist = self.templates.persistent

        self.mel, embd = graphs.build_conv(p, dims)
        embd_read, copy = pipe.handoff(embd, persist)
        pipe.add("conv", [copy or embd])

        enc = graphs.build_encoder(p, dims, ops.ref(embd_read, "embd_conv"))
        self.encoded, copy = pipe.handoff(enc, persist)
        pipe.add("encoder", [copy or enc])

        kv = graphs.build_cross(p, dims, ops.ref(self.encoded, "embd_enc"),
                                dt.dtype(self.kv_dtype))
        self.kv_cross: list[tuple[Tensor, Tensor]] = []
        outs = []
        for k, v in kv:
            k_read, k_copy = pipe.handoff(k, persist, read_repeatedly=True)
            v_read, v_copy = pipe.handoff(v, persist, read_repeatedly=True)
            self.kv_cross.append((k_read, v_read))
            outs += [k_copy or k, v_copy or v]
        pipe.add("cross", outs)

    def _build_decoders(self) -> None:
        for n_batch in sorted({1, self.max_batch}):
            self._add_decoder(n_batch, 1, 1)
            self._add_decoder(n_batch, 1, 2 if n_batch == 1 else n_batch)
        for n_tok in PROMPT_BUCKETS:
            self._add_decoder(1, n_tok, 2)

    def _cross(self) -> list[tuple[Tensor, Tensor]]:
        return [(ops.ref(k), ops.ref(v)) for k, v in self.kv_cross]

    def _add_decoder(self, n_batch: int, n_tok: int, n_rows: int) -> None:
        key = (n_batch, n_tok, n_rows)
        if key in self.decoders:
            return
        inp = graphs.decoder_inputs(n_batch, n_tok, n_rows, self.dims.n_text_ctx)
        logits = graphs.build_decoder(self.param, self.dims, inp, n_batch, n_tok, self.kv_self,
                                      self._cross())
        stage = self.pipeline.add(f"decoder[b{n_batch},n{n_tok},r{n_rows}]", [logits],
                                  group="decoder")
        self.decoders[key] = DecoderGraph(n_batch, n_tok, n_rows, inp, logits, stage.graph)

    def _add_align(self, n_tok: int) -> AlignGraph:
        """The alignment pass over n_tok tokens: its own stages, off the joint timeline
        (run only for word timestamps; their OUTPUTs would pin memory in the arena)."""
        inp = graphs.decoder_inputs(1, n_tok, 1, self.dims.n_text_ctx)
        hidden, scores = graphs.build_decoder_trunk(self.param, self.dims, inp, 1, n_tok,
                                                    self.kv_self, self._cross())
        hidden.set_output()
        heads = []
        n_audio = self.dims.n_audio_ctx
        for layer, head in self.config.alignment_heads:
            qk = scores[layer]  # (H, N, A): one sequence
            view = ops.view(qk, (n_tok, n_audio), offset=head * n_tok * n_audio * 4)
            heads.append(ops.cont(view, name=f"align.l{layer}h{head}").set_output())
        trunk = self.pipeline.add(f"align[n{n_tok}]", [hidden, *heads], group="align",
                                  joint=False)
        rows = ops.input((HEAD_ROWS,), dt.int32, "head_rows")
        logits = graphs.build_head(self.param, ops.ref(hidden, "hidden"), rows)
        head_stage = self.pipeline.add(f"align_head[n{n_tok}]", [logits], group="align_head",
                                       joint=False)
        return AlignGraph(n_tok, inp, tuple(heads), trunk.graph, rows, logits, head_stage.graph)

    def window_batch(self, n_windows: int, n_group: int) -> WindowBatch:
        """The graphs that decode n_windows windows of n_group sequences each, planned on
        first use (under a lock: sessions on several threads may ask at once). Planning
        adds no state a caller sees: the same shape always gives the same plan."""
        key = (n_windows, n_group)
        check_batch_budget(self.dims, n_windows, n_group, self.kv_dtype)  # before planning
        with self._planning:
            batch = self._window_batches.get(key)
            if batch is None:
                known = {*self.session_buffers, *self.align_buffers}
                batch = plan_window_batch(self.param, self.dims, self.templates, n_windows,
                                          n_group, kv_dtype=self.kv_dtype, plan=self.plan_mode,
                                          strategy=self.strategy, known=known)
                self._window_batches[key] = batch
                log.debug("planned a batch of %d windows x %d: %d bytes", n_windows, n_group,
                          batch.nbytes)
            return batch

    def decoder(self, n_batch: int, n_tok: int, n_rows: int) -> DecoderGraph:
        """The smallest planned decoder graph that fits (n_batch, n_tok, n_rows)."""
        fits = [g for (b, n, r), g in self.decoders.items()
                if b >= n_batch and n >= n_tok and r >= n_rows]
        if not fits:
            raise ValueError(f"no decoder graph for batch {n_batch}, {n_tok} tokens, "
                             f"{n_rows} rows (max batch {self.max_batch})")
        return min(fits, key=lambda g: (g.n_batch, g.n_tok, g.n_rows))
