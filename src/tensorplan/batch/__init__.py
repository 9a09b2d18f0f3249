"""Many files: a resumable batch over a pool of workers, each with one model and one arena.

    spec, options = ModelSpec("tiny.en"), TranscribeOptions()
    report = run_batch(collect_inputs(["talks/"]), Path("out"), ("txt", "json"), spec=spec,
                       options=options, make_pool=lambda n: LocalPool(spec, options, 2))
    sys.exit(report.exit_code)  # 2 if a file failed twice

Pools: `InProcessPool` (this process), `LocalPool` (spawned processes, `--workers N`) and
`RayPool` (Ray actors, `--ray ADDRESS`). Modules: jobs (inputs, probing, the worker),
manifest (what is done, verified by hashes), run (the driver), local, ray_pool.
"""

from __future__ import annotations

from tensorplan.batch.jobs import Input, ModelSpec, collect_inputs
from tensorplan.batch.local import LocalPool
from tensorplan.batch.manifest import MANIFEST_NAME, Manifest
from tensorplan.batch.run import InProcessPool, Pool, Report, run_batch

__all__ = ["MANIFEST_NAME", "InProcessPool", "Input", "LocalPool", "Manifest", "ModelSpec",
           "Pool", "Report", "collect_inputs", "run_batch"]
