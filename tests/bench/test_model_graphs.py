"""The benchmark graphs are the models they claim to be, and the quick benchmark runs."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from tensorplan import alloc, ops
from tensorplan.graph import Graph
from tensorplan.tensor import Flag, Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import model_graphs as mg  # noqa: E402
import plan_models as pm  # noqa: E402


def _count(graph: Graph, op: str) -> int:
    return sum(1 for t in graph.nodes if t.op is not None and t.op.name == op)


def _output(graph: Graph) -> Tensor:
    """The first tensor flagged OUTPUT."""
    return next(t for t in graph.outputs if t.has(Flag.OUTPUT))


# ---- the new 2-D ops ------------------------------------------------------------------------
def test_conv2d_and_pool2d_shapes() -> None:
    x = ops.input((3, 224, 224))
    assert ops.conv2d(x, ops.param((32, 3, 3, 3)), 2, 1).shape == (32, 112, 112)
    assert ops.conv2d(x, ops.param((8, 3, 5, 3)), (1, 2), (2, 1)).shape == (8, 224, 112)
    dw = ops.conv2d(ops.input((32, 56, 56)), ops.param((32, 1, 3, 3)), 1, 1, groups=32)
    assert dw.shape == (32, 56, 56) and dw.params["groups"] == 32
    pooled = ops.pool2d(ops.input((64, 112, 112)), 3, 2, 1)
    assert pooled.shape == (64, 56, 56) and pooled.params["stride"] == (2, 2)
    assert ops.pool2d(ops.input((8, 7, 7)), 7, mode="avg").shape == (8, 1, 1)


@pytest.mark.parametrize("build", [
    lambda: ops.conv2d(ops.input((3, 8, 8)), ops.param((4, 2, 3, 3))),  # channels disagree
    lambda: ops.conv2d(ops.input((4, 8, 8)), ops.param((6, 1, 3, 3)), groups=4),  # 6 % 4
    lambda: ops.conv2d(ops.input((3, 2, 2)), ops.param((4, 3, 3, 3))),  # too small
    lambda: ops.pool2d(ops.input((3, 8, 8)), 2, mode="median"),
])
def test_conv2d_and_pool2d_reject_bad_shapes(build) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError):
        build()


# ---- model graphs ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def graphs() -> dict[str, Graph]:
    return {name: build() for name, build in mg.MODELS.items()}


def test_every_graph_has_input_output_and_external_weights(graphs: dict[str, Graph]) -> None:
    for name, g in graphs.items():
        assert any(t.has(Flag.INPUT) for t in g.leafs), name
        if not name.endswith("_cross"):  # the cross graph's results are external cache writes
            assert _output(g).nbytes > 0, name
        params = [t for t in g.leafs if t.has(Flag.PARAM)]
        assert params and all(t.is_placed for t in params), name
        assert not any(t.has(Flag.PARAM) or t.is_placed for t in pm.planned_tensors(g)), name


@pytest.mark.parametrize(("name", "n_params"), [
    ("mobilenet_v2", 3_504_872),  # torchvision
    ("resnet50", 25_557_032),  # torchvision
    ("bert_base_s128", 109_482_240),  # HF bert-base-uncased, with the pooler
    ("bert_base_s512", 109_482_240),
    ("gpt2_small_s1024", 124_439_808),  # HF gpt2, LM head tied to wte
])
def test_parameter_counts(graphs: dict[str, Graph], name: str, n_params: int) -> None:
    assert mg.param_count(graphs[name]) == n_params


@pytest.mark.parametrize(("size", "n_params"), [("tiny", 37_760_640), ("base", 72_593_920)])
def test_whisper_parameter_counts(graphs: dict[str, Graph], size: str, n_params: int) -> None:
    # HF WhisperModel counts (encoder positions included); the cross graph holds the
    # decoder's cross-attention K/V projections
    parts = ("conv", "encoder", "cross", "decoder_448")
    assert sum(mg.param_count(graphs[f"whisper_{size}_{p}"]) for p in parts) == n_params


def test_cnn_structure(graphs: dict[str, Graph]) -> None:
    mobilenet, resnet = graphs["mobilenet_v2"], graphs["resnet50"]
    assert _output(mobilenet).shape == (1, 1000) and _count(mobilenet, "conv2d") == 52
    assert sum(1 for t in mobilenet.nodes if t.name.endswith(".residual")) == 10
    assert _output(resnet).shape == (1, 1000) and _count(resnet, "conv2d") == 53
    assert sum(1 for t in resnet.nodes if t.name.endswith(".residual")) == 16
    assert _count(resnet, "pool2d") == 1


@pytest.mark.parametrize(("name", "n_softmax", "scores", "out"), [
    ("bert_base_s128", 12, (12, 128, 128), (128, 768)),
    ("bert_base_s512", 12, (12, 512, 512), (512, 768)),
    ("gpt2_small_s1024", 12, (12, 1024, 1024), (1024, 50257)),
    ("whisper_tiny_encoder", 4, (6, 1500, 1500), (1500, 384)),
    ("whisper_base_encoder", 6, (8, 1500, 1500), (1500, 512)),
    ("whisper_tiny_decoder_448", 8, (6, 448, 448), (448, 51865)),
    ("whisper_base_decoder_step", 12, (8, 1, 448), (1, 51865)),
])
def test_transformer_structure(graphs: dict[str, Graph], name: str, n_softmax: int,
                               scores: tuple[int, ...], out: tuple[int, ...]) -> None:
    g = graphs[name]
    softmaxes = [t for t in g.nodes if t.op is not None and t.op.name == "softmax"]
    assert len(softmaxes) == n_softmax  # the decoders attend twice per layer
    assert softmaxes[0].shape == scores
    assert _output(g).shape == out


def test_whisper_conv_and_cross(graphs: dict[str, Graph]) -> None:
    assert _output(graphs["whisper_tiny_conv"]).shape == (384, 1500)
    cross = graphs["whisper_base_cross"]
    assert len(cross.outputs) == 12 and all(t.view_src is not None for t in cross.outputs)
    assert all(t.view_src.is_placed for t in cross.outputs)  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["whisper_tiny_decoder_448", "whisper_base_decoder_step"])
def test_decoder_writes_each_cache_layer_before_reading_it(graphs: dict[str, Graph],
                                                           name: str) -> None:
    g = graphs[name]
    pos = {id(t): i for i, t in enumerate(g.nodes)}
    writes = [t for t in g.nodes if t.op is not None and t.op.name == "copy_into"]
    scores = [t for t in g.nodes if t.name.endswith(".attn.scores")]
    assert len(writes) == 2 * len(scores)
    for layer, s in enumerate(scores):
        assert max(pos[id(w)] for w in writes[2 * layer: 2 * layer + 2]) < pos[id(s)]
        assert s.srcs[1].view_src is writes[0].view_src  # K is read from the cache


def test_synthetic_chain_scales_with_blocks() -> None:
    small, big = mg.synthetic_chain(10, seed=3), mg.synthetic_chain(100, seed=3)
    n_small, n_big = len(pm.planned_tensors(small)), len(pm.planned_tensors(big))
    assert 15 * 10 <= n_small <= 20 * 10 and 15 * 100 <= n_big <= 20 * 100
    again = mg.synthetic_chain(10, seed=3)
    assert [t.shape for t in again.nodes] == [t.shape for t in small.nodes]  # deterministic


@pytest.mark.parametrize(("name", "mib"), [
    ("resnet50", 9.19), ("bert_base_s128", 3.38), ("gpt2_small_s1024", 199.3),
    ("whisper_tiny_encoder", 107.4),
])
def test_lower_bound_matches_the_reference_reproduction(graphs: dict[str, Graph], name: str,
                                                        mib: float) -> None:
    # the published planners' convention (no in-place, no alignment): lifetimes here are as
    # realistic as there
    assert pm.lower_bound_no_inplace(graphs[name], 1) / pm.MiB == pytest.approx(mib, rel=5e-3)


# ---- trace generators -------------------------------------------------------------------------
@pytest.mark.parametrize("gen", sorted(pm.GENERATORS))
def test_trace_generators_partition_the_rectangle(gen: str) -> None:
    rects = pm.GENERATORS[gen](300, random.Random(5), 500, 1 << 16)
    assert len(rects) >= 300
    assert sum((t1 - t0) * (y1 - y0) for t0, t1, y0, y1 in rects) == 500 << 16
    intervals = [(i, t0, t1, y1 - y0) for i, (t0, t1, y0, y1) in enumerate(rects)]
    pm.check_packing(intervals, [r[2] for r in rects], 1 << 16)  # no overlap: a partition
    with pytest.raises(AssertionError):
        pm.check_packing(intervals, [0] * len(rects), 1 << 16)


# ---- the benchmark itself ---------------------------------------------------------------------
@pytest.mark.skipif(not all(hasattr(alloc, f) for f in ("plan_graph", "lower_bound", "pack")),
                    reason="the allocator is not built yet")
@pytest.mark.slow
def test_quick_benchmark_runs(capsys: pytest.CaptureFixture[str]) -> None:
    assert pm.main(["--quick"]) == 0
    out = capsys.readouterr().out
    for name in pm.QUICK_MODELS:
        assert name in out
    assert "pinwheel" in out
