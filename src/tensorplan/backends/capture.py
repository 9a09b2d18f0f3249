"""Graph capture: record a planned run once, replay it without re-launching each kernel.

A plan fixes every tensor's address, which is exactly what a CUDA graph needs: the
kernels of one planned run, captured once, replay against the same bytes, and a caller
changes a run's inputs by writing them into the planned input tensors first. The
executor (torch_device.py) talks to a `Capturer` only, so the policy around it (when to
capture, what to do when capture fails) is tested on the CPU with `RecordingCapturer`.
"""

from __future__ import annotations

from typing import Any, Protocol


class Replayable(Protocol):
    def replay(self) -> None:
        """Run the captured work again, over the addresses it was captured with."""
        ...


class Run(Protocol):
    """One planned graph's run over fixed views (torch_device.DeviceProgram)."""

    def __call__(self) -> None: ...

    def addresses(self) -> list[int]:
        """The device address of every tensor the run reads or writes."""
        ...


class Capturer(Protocol):
    def capture(self, run: Run) -> Replayable:
        """Record what `run` does. It may or may not run it: call replay() for a result."""
        ...


class CudaGraphCapturer:
    """torch.cuda.CUDAGraph per capture; every graph of one executor shares one memory
    pool. Sharing is safe because no pool memory outlives a replay: each kernel's
    temporaries die inside its graph, and results live in the planned buffers."""

    def __init__(self, device: Any) -> None:
        import torch

        self.torch, self.device = torch, device
        self.pool = torch.cuda.graph_pool_handle()

    def capture(self, run: Run) -> Replayable:
        torch = self.torch
        with torch.cuda.device(self.device):
            # a warm-up on a side stream first, as torch.cuda.graph's docs ask (libraries
            # set up per-stream state, e.g. cuBLAS workspaces, outside the capture)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run()
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=self.pool):
                run()
        replayable: Replayable = graph  # CUDAGraph.replay() is the whole interface
        return replayable


class RecordingCapturer:
    """The CPU stand-in for CUDA graphs, for tests: capture records the run without
    running it (stream capture launches nothing either), and every replay first checks
    that the bytes the run reads and writes have not moved since capture (a CUDA graph
    would silently use the old ones), then runs it. fail=True refuses every capture."""

    def __init__(self, fail: bool = False) -> None:
        self.fail = fail
        self.captured = 0
        self.replays = 0

    def capture(self, run: Run) -> Replayable:
        if self.fail:
            raise RuntimeError("capture refused (RecordingCapturer(fail=True))")
        self.captured += 1
        return _Recorded(self, run, run.addresses())


class _Recorded:
    def __init__(self, owner: RecordingCapturer, run: Run, pinned: list[int]) -> None:
        self.owner, self.run, self.pinned = owner, run, pinned

    def replay(self) -> None:
        if self.run.addresses() != self.pinned:
            raise AssertionError("a captured run's tensors moved between capture and replay")
        self.owner.replays += 1
        self.run()
