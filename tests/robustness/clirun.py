"""Run `python -m tensorplan ...` as a user would, and check the one-line error contract.

A bad input must give exit code 2 and exactly one stderr line, "tensorplan: error: ...",
naming the file and the problem; never a traceback. `run_cli` also reports the child's peak
RSS (from wait4, so per child), for memory bounds against a baseline run.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

# fast decoding for inputs that must merely work: greedy, one temperature, few tokens
FAST = ("--temperature", "0", "--beam-size", "1", "--sample-len", "8")


@dataclass(frozen=True)
class Run:
    rc: int
    stdout: str
    stderr: str
    maxrss_kb: int
    seconds: float  # wall clock
    cpu_seconds: float  # user + system: steadier than wall time on a shared machine


def run_cli(*args: str | os.PathLike[str], stdin: bytes | None = None, timeout: float = 120,
            cwd: str | os.PathLike[str] | None = None) -> Run:
    """`python -m tensorplan ARGS` in a fresh interpreter, with TENSORPLAN_DEBUG unset."""
    env = {k: v for k, v in os.environ.items() if k != "TENSORPLAN_DEBUG"}
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryFile() as inp:
        inp.write(stdin or b"")
        inp.seek(0)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "tensorplan", *map(str, args)],
                                stdin=inp, stdout=out, stderr=err, env=env, cwd=cwd)
        status, usage = _wait(proc, timeout)
        seconds = time.perf_counter() - t0
        out.seek(0)
        err.seek(0)
        return Run(os.waitstatus_to_exitcode(status), out.read().decode(errors="replace"),
                   err.read().decode(errors="replace"), usage.ru_maxrss, seconds,
                   usage.ru_utime + usage.ru_stime)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> tuple[int, resource.struct_rusage]:
    deadline = time.monotonic() + timeout
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            proc.returncode = os.waitstatus_to_exitcode(status)  # Popen must not wait again
            return status, usage
        if time.monotonic() > deadline:
            proc.kill()
            os.wait4(proc.pid, 0)
            proc.returncode = -9
            raise AssertionError(f"tensorplan hung: no exit within {timeout} s")
        time.sleep(0.02)


def assert_user_error(rc: int, stderr: str, *needles: str) -> str:
    """Exit 2, one stderr line "tensorplan: error: ..." holding every needle; returns it."""
    assert "Traceback" not in stderr, stderr
    lines = stderr.splitlines()
    assert len(lines) == 1, f"expected one stderr line, got {len(lines)}:\n{stderr}"
    line = lines[0]
    assert line.startswith("tensorplan: error: "), line
    for needle in needles:
        assert needle in line, f"{needle!r} not in {line!r}"
    assert rc == 2, f"exit code {rc} for {line!r}"
    return line


def assert_ok(run: Run) -> None:
    assert run.rc == 0 and "Traceback" not in run.stderr, (run.rc, run.stderr)
