"""Run `python -m tensorplan ...` as a user would, and check the one-line error contract.

A bad input must give exit code 2 and exactly one stderr line, "tensorplan: error: ...",
naming the file and the problem; never a traceback. `run_cli` also reports the child's peak
RSS (from wait4, so per child), for memory bounds against a baseline run.

The CLI is started by a small launcher process, not by pytest itself: Linux carries the
parent's peak RSS into a child that was vfork()ed (or fork()ed) and exec()ed, so a CLI started
straight from a pytest process that had grown to 1 GB reported a 1 GB peak however little it
used. The launcher's own peak (~10 MB) is what its child inherits instead.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

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
        report = Path(tempfile.mkdtemp()) / "rusage"
        try:
            proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(report), sys.executable,
                                     "-m", "tensorplan", *map(str, args)],
                                    stdin=inp, stdout=out, stderr=err, env=env, cwd=cwd,
                                    start_new_session=True)  # one group: a hang kills both
            _wait(proc, timeout)
            seconds = time.perf_counter() - t0
            status, maxrss_kb, cpu_seconds = report.read_text().split()
        finally:
            report.unlink(missing_ok=True)
            report.parent.rmdir()
        out.seek(0)
        err.seek(0)
        return Run(os.waitstatus_to_exitcode(int(status)), out.read().decode(errors="replace"),
                   err.read().decode(errors="replace"), int(maxrss_kb), seconds,
                   float(cpu_seconds))


# argv: REPORT CMD...; runs CMD on the inherited stdio and writes "status maxrss_kb cpu_s"
_LAUNCHER = """
import os, subprocess, sys
child = subprocess.Popen(sys.argv[2:])
_, status, usage = os.wait4(child.pid, 0)
child.returncode = 0  # reaped here: Popen must not wait again
with open(sys.argv[1], "w") as f:
    f.write(f"{status} {usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
"""


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise AssertionError(f"tensorplan hung: no exit within {timeout} s") from None


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
