"""One thread setting reaches every pool: OpenBLAS, PyTorch's intra-op pool, onnxruntime.

Nothing here is timed: the speed of each setting is measured in bench/concurrency.py.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

from tensorplan.backends import threads


@pytest.fixture(autouse=True)
def _adaptive_afterwards() -> Iterator[None]:
    yield
    threads.configure(None)


def _blas_threads() -> set[int]:
    return {int(i["num_threads"]) for i in threadpool_info() if i["user_api"] == "blas"}


def test_configure_sets_the_blas_pool() -> None:
    if threads._blas() is None:
        pytest.skip("threadpoolctl finds no BLAS")
    for n in (1, 2):
        assert threads.configure(n) == n == threads.count()
        assert _blas_threads() == {n}


def test_big_products_use_the_configured_count_small_ones_one() -> None:
    if threads._blas() is None:
        pytest.skip("threadpoolctl finds no BLAS")
    numpys = threads._blas()  # the BLAS numpy's products run on (asked, not our record)
    threads.configure(2)
    with threads.for_product(threads.SMALL_PRODUCT - 1):
        assert numpys.num_threads == 1
    with threads.for_product(threads.SMALL_PRODUCT * 10):
        assert numpys.num_threads == 2


def test_a_product_keeps_its_thread_count_while_another_thread_wants_another() -> None:
    """OpenBLAS's count is process-wide and a product's rounding depends on it: a product
    that wants another count waits until the running ones finish."""
    import threading

    if threads._blas() is None:
        pytest.skip("threadpoolctl finds no BLAS")
    threads.configure(2)
    inside, release, seen = threading.Event(), threading.Event(), []

    def big() -> None:
        with threads.for_product(threads.SMALL_PRODUCT * 10):
            inside.set()
            release.wait(5)
            seen.append("big done")

    def small() -> None:
        with threads.for_product(1):
            seen.append("small")

    a = threading.Thread(target=big)
    a.start()
    inside.wait(5)
    b = threading.Thread(target=small)
    b.start()
    b.join(0.3)
    assert b.is_alive()  # the small product waits for the big one
    release.set()
    a.join(5)
    b.join(5)
    assert seen == ["big done", "small"]


def _loadavg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: int) -> None:
    path = tmp_path / "loadavg"
    path.write_text(f"1.00 0.50 0.25 {running}/300 4242\n")
    monkeypatch.setattr(threads, "LOADAVG", str(path))


@pytest.mark.parametrize(("running", "want"), [(1, 4), (2, 3), (3, 2), (4, 1), (9, 1)])
def test_default_leaves_the_cores_other_processes_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, running: int, want: int
) -> None:
    monkeypatch.setattr(threads, "cores", lambda: 4)
    _loadavg(tmp_path, monkeypatch, running)  # this process is one of the runnable
    assert threads.configure(None) == want == threads.count()
    assert threads.configure(3) == 3  # an explicit count always wins


def test_no_loadavg_means_every_core(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(threads, "cores", lambda: 4)
    monkeypatch.setattr(threads, "LOADAVG", str(tmp_path / "missing"))
    assert threads.configure(None) == 4


def test_small_pools_keep_their_default_unless_threads_are_set() -> None:
    threads.configure(None)
    assert threads.for_pool(1) == 1
    threads.configure(3)
    assert threads.for_pool(1) == 3


def test_torch_backend_sets_torchs_pool() -> None:
    torch = pytest.importorskip("torch")
    from tensorplan.backends.torch_cpu import TorchBackend

    threads.configure(1)
    TorchBackend()
    assert torch.get_num_threads() == 1
    threads.configure(2)  # torch now imported: configure reaches it directly
    assert torch.get_num_threads() == 2


def test_vad_session_takes_the_setting() -> None:
    if importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("onnxruntime is not installed")
    from tensorplan.whisper import vad

    try:
        threads.configure(None)
        default = vad.load_vad_model()
        threads.configure(2)
        two = vad.load_vad_model()
    except vad.UserError as e:  # silero-vad's model missing
        pytest.skip(str(e))
    assert default.session.get_session_options().intra_op_num_threads == 1
    assert two.session.get_session_options().intra_op_num_threads == 2


def test_load_model_threads_reach_every_pool() -> None:
    """threads= (--threads) through the API's load: BLAS and torch both see it."""
    torch = pytest.importorskip("torch")
    from tensorplan.whisper.api import load_model

    load_model("tiny.en", threads=1, backend="torch")
    assert torch.get_num_threads() == 1
    if threads._blas() is not None:
        assert _blas_threads() == {1}
