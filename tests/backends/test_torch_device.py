"""The device backend's own contract, on the CPU: capture and replay of planned runs
(through the recording stand-in for CUDA graphs), narrowed weights, missing devices."""

from __future__ import annotations

import logging

import numpy as np
import pytest

pytest.importorskip("torch")

from backend_cases import place_all  # noqa: E402

from tensorplan import ops  # noqa: E402
from tensorplan.backends import make_backend  # noqa: E402
from tensorplan.backends.capture import RecordingCapturer  # noqa: E402
from tensorplan.backends.torch_device import DeviceBackend  # noqa: E402
from tensorplan.errors import UserError  # noqa: E402
from tensorplan.graph import Graph  # noqa: E402
from tensorplan.tensor import Tensor  # noqa: E402


def _layer(backend: DeviceBackend, rng: np.random.Generator) -> tuple[Tensor, Tensor, Graph,
                                                                      np.ndarray]:
    """x (4, 8) INPUT -> gelu(x @ w.T + b), placed; returns (x, out, graph, w)."""
    w = rng.standard_normal((6, 8)).astype(np.float32)
    x = ops.input((4, 8), name="x")
    out = ops.gelu(ops.linear(x, backend.param(w, "w"), backend.param(np.ones(6, np.float32))))
    graph = Graph.build(out)
    place_all(graph, backend)
    return x, out, graph, w


def _want(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    import scipy.special

    y = x.astype(np.float64) @ w.T + 1
    return np.asarray(y * (1 + scipy.special.erf(y / np.sqrt(2))) / 2)


def test_a_graph_is_captured_after_its_first_run_and_replays_new_inputs() -> None:
    cap = RecordingCapturer()
    backend = DeviceBackend("cpu", capturer=cap)
    rng = np.random.default_rng(0)
    x, out, graph, w = _layer(backend, rng)
    for run in range(4):
        value = rng.standard_normal((4, 8)).astype(np.float32)
        backend.set(x, value)  # into the planned input: the address the capture holds
        made = backend.views_made
        backend.compute(graph)
        assert (cap.captured, cap.replays) == (min(run, 1), max(run, 0))
        if run >= 2:
            assert backend.views_made == made  # nothing re-made between replays
        np.testing.assert_allclose(backend.get(out), _want(value, w), rtol=1e-5, atol=1e-5)


def test_a_moved_tensor_drops_the_capture_instead_of_replaying_stale_addresses() -> None:
    cap = RecordingCapturer()
    backend = DeviceBackend("cpu", capturer=cap)
    rng = np.random.default_rng(1)
    x, out, graph, w = _layer(backend, rng)
    backend.compute(graph)
    backend.compute(graph)  # captured
    x.place(backend.buffer_type.alloc_buffer(x.nbytes), 0)  # re-planned elsewhere
    value = rng.standard_normal((4, 8)).astype(np.float32)
    backend.set(x, value)
    backend.compute(graph)  # re-bound, eager again: replay would read the old bytes
    assert cap.captured == 1
    np.testing.assert_allclose(backend.get(out), _want(value, w), rtol=1e-5, atol=1e-5)
    backend.compute(graph)
    assert cap.captured == 2


def test_a_failed_capture_warns_once_and_stays_eager(caplog: pytest.LogCaptureFixture) -> None:
    backend = DeviceBackend("cpu", capturer=RecordingCapturer(fail=True))
    rng = np.random.default_rng(2)
    layers = [_layer(backend, rng) for _ in range(2)]
    with caplog.at_level(logging.WARNING, logger="tensorplan.backends"):
        for x, out, graph, w in layers * 3:
            value = rng.standard_normal((4, 8)).astype(np.float32)
            backend.set(x, value)
            backend.compute(graph)
            np.testing.assert_allclose(backend.get(out), _want(value, w), rtol=1e-5, atol=1e-5)
    warnings = [r for r in caplog.records if "capture failed" in r.getMessage()]
    assert len(warnings) == 1


def test_narrowed_weights_are_stored_in_float16_and_stay_close() -> None:
    """weights_dtype float16 (what cuda uses) on the CPU: matrices held narrow, products
    and lookups computed through them; float16 rounding bounds the error (2^-11 per
    weight, so a relative error of a few 1e-4 after an 8-term sum)."""
    backend = DeviceBackend("cpu", weights_dtype="float16")
    rng = np.random.default_rng(3)
    table = rng.standard_normal((10, 8)).astype(np.float32)
    ids = ops.input((3,), ops.dt.int32, "ids")
    emb = backend.param(table, "emb")
    x, out, graph, w = _layer(backend, rng)
    rows = ops.get_rows(emb, ids)
    g2 = Graph.build(rows)
    place_all(g2, backend)
    assert backend.view(emb).dtype.is_floating_point and backend.view(emb).element_size() == 2
    value = rng.standard_normal((4, 8)).astype(np.float32)
    backend.set(x, value)
    backend.compute(graph)
    got, want = backend.get(out), _want(value, w)
    assert got.dtype == np.float32
    assert np.linalg.norm(got - want) / np.linalg.norm(want) <= 2e-3
    backend.set(ids, np.array([0, 9, 3], np.int32))
    backend.compute(g2)
    np.testing.assert_allclose(backend.get(rows), table[[0, 9, 3]], rtol=1e-3, atol=1e-3)


def test_cuda_without_cuda_is_one_user_error() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(UserError, match="CUDA is not available"):
        make_backend("auto", "cuda")
    with pytest.raises(ValueError, match="CPU only"):
        make_backend("numpy", "cuda")


def test_the_cli_refuses_cuda_here_in_one_line_with_exit_2(capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    import torch

    from tensorplan.cli import main

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert main(["transcribe", "--device", "cuda", "samples/jfk.wav"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "CUDA is not available" in err, err
