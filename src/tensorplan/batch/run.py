"""The batch driver: decide what to do, hand files to a pool longest first, write results.

The driver is the only writer: workers (processes or Ray actors) return results, and the
driver writes every output file and the manifest atomically. So OUT needs no shared storage
on a cluster, and a killed run leaves only whole files behind: a rerun skips what the
manifest records as done and verified, and redoes the rest.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tensorplan.batch.jobs import (
    MAX_ATTEMPTS,
    Done,
    Failed,
    Input,
    ModelSpec,
    Outcome,
    Task,
    Worker,
    output_dir,
    output_names,
    probe_seconds,
)
from tensorplan.batch.manifest import Manifest, locked, sha256_file
from tensorplan.errors import UserError
from tensorplan.files import quote
from tensorplan.whisper.flags import to_argv
from tensorplan.whisper.options import TranscribeOptions
from tensorplan.whisper.writers import SubtitleOptions, write_outputs

SAVE_INTERVAL = 1.0  # seconds: the manifest is rewritten at most this often while files finish


class Pool(Protocol):
    """Workers that each hold one model. `wait` blocks until at least one submitted task
    has an outcome; a worker that died yields Failed(crashed=True) and is replaced."""

    @property
    def n_idle(self) -> int: ...

    @property
    def n_busy(self) -> int: ...

    def submit(self, task: Task) -> None: ...

    def wait(self) -> list[tuple[Task, Outcome]]: ...

    def close(self) -> None: ...


class InProcessPool:
    """One model in this process; `wait` runs the submitted file."""

    def __init__(self, spec: ModelSpec, options: TranscribeOptions) -> None:
        self.worker = Worker(spec, options)
        self.task: Task | None = None

    @property
    def n_idle(self) -> int:
        return int(self.task is None)

    @property
    def n_busy(self) -> int:
        return int(self.task is not None)

    def submit(self, task: Task) -> None:
        self.task = task

    def wait(self) -> list[tuple[Task, Outcome]]:
        task, self.task = self.task, None
        assert task is not None, "wait() with nothing submitted"
        return [(task, self.worker.run(task, in_pool=False))]

    def close(self) -> None:
        pass


@dataclass
class Report:
    done: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # already done in an earlier run
    failed: dict[str, str] = field(default_factory=dict)  # key -> last error
    audio_seconds: float = 0.0  # transcribed in this run
    wall_seconds: float = 0.0

    @property
    def exit_code(self) -> int:
        return 2 if self.failed else 0

    def summary(self) -> str:
        n = len(self.done) + len(self.skipped) + len(self.failed)
        speed = self.audio_seconds / self.wall_seconds if self.wall_seconds else 0.0
        return (f"{n} files: {len(self.done)} transcribed, {len(self.skipped)} already done, "
                f"{len(self.failed)} failed; {self.audio_seconds:.1f} s of audio in "
                f"{self.wall_seconds:.1f} s ({speed:.2f}x real time)")


def run_batch(inputs: Sequence[Input], out_dir: Path, formats: Sequence[str], *,
              spec: ModelSpec, options: TranscribeOptions, make_pool: Callable[[int], Pool],
              verbose: bool = True, subtitles: SubtitleOptions | None = None) -> Report:
    """Transcribe every input not already done into out_dir; never raises for a bad file.

    `make_pool(n_files)` is called only when there is work, with the number of files to
    transcribe (a pool needs no more workers than that). Raises UserError when the pool cannot
    start (e.g. the model does not load) or an output cannot be written.
    """
    start = time.perf_counter()
    with locked(out_dir):
        batch = _Batch(Manifest.load(out_dir), formats, _settings(spec, options, subtitles),
                       verbose, subtitles)
        try:
            jobs = batch.plan(inputs)
            if jobs:
                with closing(make_pool(len(jobs))) as pool:
                    batch.drain(pool, jobs)
        finally:
            batch.progress.close()
            batch.manifest.save()
    batch.report.wall_seconds = time.perf_counter() - start
    return batch.report


def _settings(spec: ModelSpec, options: TranscribeOptions,
              subtitles: SubtitleOptions | None = None) -> dict[str, Any]:
    """What makes two runs' outputs comparable (plan modes and strategies give the same).
    Subtitle options appear only when set, so earlier manifests still match."""
    settings: dict[str, Any] = {"model": spec.name, "options": to_argv(options)}
    if subtitles is not None and subtitles != SubtitleOptions():
        settings["subtitles"] = dataclasses.asdict(subtitles)
    return settings


@dataclass(frozen=True, slots=True)
class _Job:
    input: Input
    seconds: float  # probed: the scheduling key and the progress bar's unit


class _Batch:
    def __init__(self, manifest: Manifest, formats: Sequence[str], settings: dict[str, Any],
                 verbose: bool, subtitles: SubtitleOptions | None = None) -> None:
        self.manifest = manifest
        self.subtitles = subtitles
        self.formats = tuple(formats)
        self.settings = settings
        self.verbose = verbose
        self.report = Report()
        self.progress = _Progress()
        self.jobs: dict[str, _Job] = {}
        self.last_save = 0.0

    def plan(self, inputs: Sequence[Input]) -> list[_Job]:
        """Skip the verified-done inputs; the rest become pending jobs, longest first."""
        for item in inputs:
            try:
                sha = sha256_file(item.path)
            except (OSError, UserError) as e:  # unreadable, or a FIFO: failed without a try
                entry = self.manifest.begin(item.key, item.path, "", self.settings)
                entry.status = "failed"
                entry.error = (str(e) if isinstance(e, UserError)
                               else f"{quote(item.path)}: cannot read: {e.strerror}")
                self.report.failed[item.key] = entry.error
                self.progress.write(f"tensorplan: error: {item.key}: {entry.error}", sys.stderr)
                continue
            outputs = output_names(item.key, self.formats)
            if self.manifest.is_complete(item.key, sha, self.settings, outputs):
                self.report.skipped.append(item.key)
                continue
            self.manifest.begin(item.key, item.path, sha, self.settings)
            self.jobs[item.key] = _Job(item, probe_seconds(item.path))
        self.manifest.save()
        jobs = sorted(self.jobs.values(), key=lambda j: -j.seconds)
        self.progress.start(len(jobs), sum(j.seconds for j in jobs))
        return jobs

    def drain(self, pool: Pool, jobs: Sequence[_Job]) -> None:
        queue = deque(Task(j.input.key, str(j.input.path), attempt=1) for j in jobs)
        while queue or pool.n_busy:
            while queue and pool.n_idle:
                task = queue.popleft()
                self.manifest.entries[task.key].attempts = task.attempt
                pool.submit(task)
            for task, outcome in pool.wait():
                retry = self.finish(task, outcome, more=bool(queue) or pool.n_busy > 0)
                if retry is not None:
                    queue.append(retry)  # behind the others: a bad file does not block them

    def finish(self, task: Task, outcome: Outcome, more: bool) -> Task | None:
        """Record one outcome; return the task to retry, if any."""
        entry = self.manifest.entries[task.key]
        job = self.jobs[task.key]
        retry = None
        if isinstance(outcome, Done):
            written = write_outputs(outcome.result, job.input.path,
                                    output_dir(self.manifest.out_dir, task.key), self.formats,
                                    self.subtitles)
            root = self.manifest.out_dir
            entry.outputs = {p.relative_to(root).as_posix(): sha256_file(p) for p in written}
            entry.status, entry.error = "done", None
            entry.audio_seconds = round(outcome.audio_seconds, 3)
            self.report.done.append(task.key)
            self.report.audio_seconds += outcome.audio_seconds
            self.progress.advance(job.seconds)
            if self.verbose:
                self.progress.write(f"{task.key}: {outcome.audio_seconds:.1f} s of audio in "
                                    f"{outcome.seconds:.1f} s", sys.stdout)
        elif isinstance(outcome, Failed):
            entry.error = outcome.error
            if task.attempt < MAX_ATTEMPTS:
                retry = Task(task.key, task.path, task.attempt + 1)
                self.progress.write(f"tensorplan: {task.key}: attempt {task.attempt} failed, "
                                    f"retrying: {outcome.error}", sys.stderr)
            else:
                entry.status = "failed"
                self.report.failed[task.key] = outcome.error
                self.progress.advance(job.seconds)
                self.progress.write(f"tensorplan: error: {task.key}: failed {task.attempt} "
                                    f"times: {outcome.error}", sys.stderr)
        self._save(more)
        return retry

    def _save(self, more: bool) -> None:
        """After each file; while others are still finishing, at most every SAVE_INTERVAL
        seconds (a file finished since the last save is only redone after a kill)."""
        now = time.monotonic()
        if not more or now - self.last_save >= SAVE_INTERVAL:
            self.manifest.save()
            self.last_save = now


class _Progress:
    """A tqdm bar over files and (probed) audio seconds on a terminal; plain lines otherwise."""

    def __init__(self) -> None:
        self.bar: Any = None
        self.n_files = self.n_done = 0

    def start(self, n_files: int, seconds: float) -> None:
        self.n_files = n_files
        if n_files and sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=round(seconds, 1), unit="s", desc=self._desc(),
                            dynamic_ncols=True, leave=False)

    def advance(self, seconds: float) -> None:
        self.n_done += 1
        if self.bar is not None:
            self.bar.set_description(self._desc(), refresh=False)
            self.bar.update(min(round(seconds, 1), self.bar.total - self.bar.n))

    def write(self, line: str, file: Any) -> None:
        if self.bar is not None:
            self.bar.write(line, file=file)
        else:
            print(line, file=file, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def _desc(self) -> str:
        return f"{self.n_done}/{self.n_files} files"
