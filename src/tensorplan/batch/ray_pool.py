"""`--ray ADDRESS`: workers are Ray actors, one model each, anywhere on a Ray cluster.

Ray places the actors (`num_cpus` each, `num_gpus` once there is a GPU backend) and moves
the data; the driver keeps the queue (longest first) and hands each file to an idle actor.
The driver reads each input and ships its bytes (except with "local", where actors read the
path), and actors return results that the driver writes: neither inputs nor OUT need to be
on storage the cluster nodes share. Every node
needs tensorplan installed (the same version) in the Python that runs Ray. An actor that dies
fails its file as crashed (the driver retries it) and is replaced by a new one.

ADDRESS: "local" starts a Ray instance on this machine, "auto" joins the cluster this
machine is a node of, anything else is a head address ("10.0.0.5:6379", "ray://...").
When Ray is already initialized in this process, that instance is used and left running.
"""

from __future__ import annotations

import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from tensorplan.batch.jobs import (
    CRASH_HOOK,
    Failed,
    ModelSpec,
    Outcome,
    Task,
    Worker,
    blas_env,
    describe,
)
from tensorplan.errors import UserError
from tensorplan.machine import cores
from tensorplan.whisper.options import TranscribeOptions


class RayWorker:
    """The actor: one model. A model that fails to load is reported by `ready`, not raised,
    so the driver can show the reason as one line."""

    def __init__(self, spec: ModelSpec, options: TranscribeOptions) -> None:
        self.worker: Worker | None = None
        self.error: str | None = None
        try:
            self.worker = Worker(spec, options)
        except Exception as e:
            self.error = describe(e)

    def ready(self) -> str | None:
        return self.error

    def run(self, task: Task, data: bytes | None) -> Outcome:
        if self.worker is None:
            return Failed(task.key, f"the worker could not load the model: {self.error}")
        return self.worker.run(task, data)


class RayPool:
    def __init__(self, spec: ModelSpec, options: TranscribeOptions, address: str,
                 n_workers: int | None = None, cpus_per_worker: int = 1,
                 gpus_per_worker: float = 0, max_workers: int | None = None) -> None:
        """n_workers actors (default: the cluster's CPUs / cpus_per_worker), at most
        max_workers."""
        check_address(address)  # before Ray's import (seconds) and its own parsing
        self.ray = _import_ray()
        self.owns_ray = not self.ray.is_initialized()
        self.ship_inputs = address != "local"  # else every actor runs on this machine
        if self.owns_ray:
            _connect(self.ray, address)
        try:
            cpus = self.ray.cluster_resources().get("CPU", 1)
            n = n_workers or max(1, int(cpus // cpus_per_worker))
            n = min(n, max_workers or n)
            env = blas_env(cpus_per_worker)
            if CRASH_HOOK in os.environ:
                env[CRASH_HOOK] = os.environ[CRASH_HOOK]
            self.actor_class = self.ray.remote(
                num_cpus=cpus_per_worker, num_gpus=gpus_per_worker,
                runtime_env={"env_vars": env})(RayWorker)
            self.spec, self.options = spec, options
            self.idle = [self._new_actor() for _ in range(n)]
            self.running: dict[Any, tuple[Any, Task]] = {}  # ObjectRef -> (actor, task)
            self.unsent: list[tuple[Task, Outcome]] = []  # inputs the driver could not read
            errors = self.ray.get([actor.ready.remote() for actor in self.idle])
        except BaseException:
            self._shutdown()
            raise
        if any(errors):
            self.close()
            raise UserError(f"a Ray worker could not load the model: {next(filter(None, errors))}")

    @property
    def n_idle(self) -> int:
        return len(self.idle)

    @property
    def n_busy(self) -> int:
        return len(self.running) + len(self.unsent)

    def submit(self, task: Task) -> None:
        try:
            data = Path(task.path).read_bytes() if self.ship_inputs else None
        except OSError as e:
            self.unsent.append((task, Failed(task.key, f"{task.path}: cannot read: {e}")))
            return
        actor = self.idle.pop()
        self.running[actor.run.remote(task, data)] = (actor, task)

    def wait(self) -> list[tuple[Task, Outcome]]:
        if self.unsent:
            outcomes, self.unsent = self.unsent, []
            return outcomes
        ready, _ = self.ray.wait(list(self.running), num_returns=1)
        outcomes = []
        for ref in ready:
            actor, task = self.running.pop(ref)
            outcomes.append((task, self._result(ref, actor, task)))
        return outcomes

    def close(self) -> None:
        for actor in [*self.idle, *(actor for actor, _ in self.running.values())]:
            self.ray.kill(actor)
        self.idle, self.running = [], {}
        self._shutdown()

    def _result(self, ref: Any, actor: Any, task: Task) -> Outcome:
        exceptions = self.ray.exceptions
        try:
            outcome: Outcome = self.ray.get(ref)
        except exceptions.RayActorError as e:
            self.ray.kill(actor)
            self.idle.append(self._new_actor())
            return Failed(task.key, f"Ray worker died ({_first_line(e)})", crashed=True)
        except exceptions.RayError as e:
            self.idle.append(actor)
            return Failed(task.key, f"Ray: {_first_line(e)}")
        self.idle.append(actor)
        return outcome

    def _new_actor(self) -> Any:
        return self.actor_class.remote(self.spec, self.options)

    def _shutdown(self) -> None:
        if self.owns_ray:
            self.ray.shutdown()


def _import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise UserError("--ray needs Ray: pip install 'tensorplan[ray]'") from None
    return ray


CONNECT_TIMEOUT_S = 10.0  # a head that accepts no TCP connection in this long is not there


_HOST = re.compile(r"\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+")  # a name, an IPv4, or [IPv6]


def check_address(address: str) -> None:
    """UserError unless `address` is "local", "auto" or [ray://]HOST:PORT with a port from 1
    to 65535 (Ray's own parsing of anything else ended in a traceback)."""
    if address in ("local", "auto"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not (sep and _HOST.fullmatch(host) and port.isascii() and port.isdigit()
            and 1 <= int(port) <= 65535):
        raise UserError(f"--ray {address!r}: expected 'local', 'auto' or HOST:PORT (e.g. "
                        "10.0.0.5:6379, or ray://HOST:10001 for Ray Client)")


def _check_reachable(address: str) -> None:
    """UserError within CONNECT_TIMEOUT_S if HOST:PORT (or ray://HOST:PORT) accepts no TCP
    connection; other forms ("auto") are left to Ray."""
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not host or not port.isdigit():
        return
    try:
        socket.create_connection((host.strip("[]"), int(port)), CONNECT_TIMEOUT_S).close()
    except OSError as e:
        why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
        raise UserError(f"--ray {address}: nothing answers there ({why}); is the Ray head "
                        "running?") from None


def _connect(ray: Any, address: str) -> None:
    try:
        if address == "local":
            ray.init(num_cpus=cores(), include_dashboard=False, logging_level=logging.WARNING)
        else:
            _check_reachable(address)  # ray.init retries a dead address for minutes
            ray.init(address=address, logging_level=logging.WARNING)
    except (ConnectionError, ValueError, RuntimeError) as e:
        raise UserError(f"cannot connect to Ray at {address!r}: {_first_line(e)}") from None


def _first_line(e: BaseException) -> str:
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    return lines[0] if lines else type(e).__name__
