"""One thread setting reaches every pool: OpenBLAS, PyTorch's intra-op pool, onnxruntime.

Nothing here is timed: the speed of each setting is measured in bench/concurrency.py.
"""

from __future__ import annotations

import importlib.util
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from threadpoolctl import threadpool_info

from tensorplan.backends import threads
from tensorplan.machine import computing


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


def test_every_product_runs_on_the_configured_count() -> None:
    """Small and big alike: a count changed per product made concurrent sessions differ
    from a lone run (tests/whisper/planned/test_sessions.py checks the transcripts)."""
    if threads._blas() is None:
        pytest.skip("threadpoolctl finds no BLAS")
    numpys = threads._blas()  # the BLAS numpy's products run on (asked, not our record)
    for n in (1, 2):
        threads.configure(n)
        for macs in (1, 10**9):
            with threads.for_product(macs):
                assert numpys.num_threads == n


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


def test_torch_backend_sets_torchs_pool() -> None:
    torch = pytest.importorskip("torch")
    from tensorplan.backends.torch_cpu import TorchBackend

    threads.configure(1)
    TorchBackend()
    assert torch.get_num_threads() == 1
    threads.configure(2)  # torch now imported: configure reaches it directly
    assert torch.get_num_threads() == 2


def test_vad_session_keeps_one_thread_whatever_the_setting() -> None:
    """Silero's windows are tiny and sequential: a second onnxruntime thread was no faster
    and spun on a core the decoders need (vad.py has the figures)."""
    if importlib.util.find_spec("onnxruntime") is None:
        pytest.skip("onnxruntime is not installed")
    from tensorplan.whisper.audio import vad

    threads.configure(2)
    try:
        model = vad.load_vad_model()
    except vad.UserError as e:  # silero-vad's model missing
        pytest.skip(str(e))
    assert model.session.get_session_options().intra_op_num_threads == 1


@contextmanager
def _others_computing(n: int) -> Iterator[None]:
    """n other OS threads inside machine.computing() until the block ends."""
    inside, leave = threading.Barrier(n + 1, timeout=30), threading.Event()

    def hold() -> None:
        with computing():
            inside.wait()
            leave.wait(30)

    held = [threading.Thread(target=hold) for _ in range(n)]
    for t in held:
        t.start()
    inside.wait()
    try:
        yield
    finally:
        leave.set()
        for t in held:
            t.join()


def test_threads_computing_at_once_split_the_cores() -> None:
    """Inside computing(), a kernel's count is count() // (threads inside it now), read
    at each kernel, at least one; a thread outside keeps the whole count; a thread inside
    twice counts once."""
    threads.configure(4)
    assert threads.share(4) == 4
    with computing():
        assert threads.share(4) == 4  # alone
        with computing():
            assert threads.share(4) == 4  # nested: still one thread
        with _others_computing(1):
            assert threads.share(4) == 2
            assert threads.share(1) == 1  # a small node's one thread stays one
        with _others_computing(2):
            assert threads.share(4) == 1
        assert threads.share(4) == 4  # they left
    with _others_computing(3):
        assert threads.share(4) == 4  # this thread is not computing(): unchanged


def test_torch_kernels_take_the_shared_count() -> None:
    torch = pytest.importorskip("torch")
    from tensorplan.backends.torch_cpu import _on_threads, load_torch

    load_torch()
    threads.configure(2)
    ran: list[int] = []
    kernel = _on_threads(lambda out, srcs, params: ran.append(torch.get_num_threads()), 2)
    kernel(None, [], {})
    with computing(), _others_computing(1):
        kernel(None, [], {})
    kernel(None, [], {})
    assert ran == [2, 1, 2]


def test_a_new_thread_keeps_the_count_it_set() -> None:
    """PyTorch sets a new OS thread's count at its first parallel op from the last count
    any thread set: a share set before that was lost (the kernel ran on 2 of 2)."""
    torch = pytest.importorskip("torch")
    from tensorplan.backends.torch_cpu import _on_threads, load_torch

    load_torch()
    threads.configure(2)
    set_here, other_set = threading.Event(), threading.Event()
    ran: list[int] = []

    def first(out: object, srcs: object, params: object) -> None:
        set_here.set()
        other_set.wait(30)  # another thread sets 2 before this one's first op
        torch.ones(64).add_(1)
        ran.append(torch.get_num_threads())

    def shared() -> None:
        with computing(), _others_computing(1):
            _on_threads(first, 2)(None, [], {})

    def other() -> None:
        set_here.wait(30)
        torch.set_num_threads(2)
        other_set.set()

    a, b = threading.Thread(target=shared), threading.Thread(target=other)
    a.start()
    b.start()
    a.join()
    b.join()
    assert ran == [1]


def test_load_model_threads_reach_every_pool() -> None:
    """threads= (--threads) through the API's load: BLAS and torch both see it."""
    torch = pytest.importorskip("torch")
    from tensorplan.whisper.api import load_model

    load_model("tiny.en", threads=1, backend="torch")
    assert torch.get_num_threads() == 1
    if threads._blas() is not None:
        assert _blas_threads() == {1}
