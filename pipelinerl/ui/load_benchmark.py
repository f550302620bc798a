"""How fast the dashboard answers for a long run: a synthetic run of N steps written through the
platform's own store API (and MLflow, and the run directory's ``metrics.jsonl``), then the pages
and API endpoints timed over HTTP against a real server on 127.0.0.1.

    python -m pipelinerl.ui.load_benchmark --steps 10000 --port 27250

Everything lives in a temporary directory that is removed afterwards. The numbers it prints are
recorded in ``docs/benchmarks.md`` ("Dashboard").
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import uvicorn

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.mlflow_store import MetricPoint, MlflowStore
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.app import UiSettings, create_app

# Endpoints a user's first look at a run page costs (the page, then its five API calls).
RUN_PAGE_REQUESTS = (
    "/runs/{run_id}",
    "/api/runs/{run_id}",
    "/api/runs/{run_id}/steps",
    "/api/runs/{run_id}/live",
    "/api/runs/{run_id}/lag-histogram",
    "/api/runs/{run_id}/lag-by-position",
)
POSITION_BUCKETS = 16
CHECKPOINT_EVERY = 25
MLFLOW_METRICS = (registry.ACTOR_TOKENS_PER_S, registry.ACTOR_IDLE_FRACTION, registry.QUEUE_ROLLOUTS)
EVAL_METRIC = registry.name_of(registry.EVAL_SET_PASS_AT, set="heldout", k=1)
EVALUATIONS = 10


@dataclass(frozen=True)
class SyntheticRun:
    run_id: str
    database_url: str
    mlflow_uri: str | None
    run_dir: Path


def fill_synthetic_run(
    root: Path,
    steps: int,
    run_id: str = "20261122-000000-pipeline-synth",
    *,
    mode: str = "pipeline",
    experiment: str = "synthetic",
    parent_run_id: str | None = None,
    seconds_per_step: float = 2.0,
    started: datetime = datetime(2026, 11, 22, tzinfo=UTC),
    with_mlflow: bool = True,
    database_url: str | None = None,
) -> SyntheticRun:
    """A finished run of ``steps`` steps under ``root``: platform database rows (run, step statistics,
    lag histograms, policy versions with pauses and checkpoints), the trainer's ``metrics.jsonl`` and,
    with ``with_mlflow``, the actors' metrics, held-out evaluations and a restart half-way in a SQLite
    MLflow store. Several runs may share a root. The database is a SQLite file in ``root`` unless
    ``database_url`` names another."""
    database_url = database_url or f"sqlite:///{root / 'platform.db'}"
    output_dir = root / "runs"
    run_dir = output_dir / run_id
    run_dir.mkdir(parents=True)
    rng = random.Random(0)
    mlflow_uri = f"sqlite:///{root / 'mlflow.db'}" if with_mlflow else None
    mlflow_run_id = (
        _mlflow_run(mlflow_uri, root, experiment, run_id, steps, started, seconds_per_step, rng)
        if mlflow_uri
        else None
    )
    with PlatformStore(database_url) as store, (run_dir / "metrics.jsonl").open("w") as metrics:
        store.create_run(
            run_id,
            name=experiment,
            mode=mode,
            config={"run": {"output_dir": str(output_dir), "mode": mode}},
            started_at=started,
            mlflow_run_id=mlflow_run_id,
            parent_run_id=parent_run_id,
        )
        for version in range(1, steps + 1):
            at = started + timedelta(seconds=seconds_per_step * version)
            histogram = [rng.randint(100, 400), rng.randint(50, 200), rng.randint(0, 50), rng.randint(0, 5)]
            reward = 0.2 + 0.6 * (1 - math.exp(-version / (steps / 4))) + rng.uniform(-0.05, 0.05)
            store.record_step(
                run_id,
                version,
                {
                    registry.LOSS: rng.uniform(-0.1, 0.1),
                    registry.REWARD_MEAN: reward,
                    registry.ESS: rng.uniform(0.85, 1.0),
                    registry.LAG_MEAN: 0.6,
                    registry.LAG_P50: 0.0,
                    registry.LAG_P90: 2.0,
                    registry.LAG_MAX: 3,
                    registry.TRAINER_TOKENS: sum(histogram),
                    registry.TRAINER_SAMPLES: 16,
                    registry.TRAINER_STEP_S: 1.5,
                    registry.TRAINER_WAIT_S: 0.5,
                },
                histogram,
                created_at=at,
            )
            store.record_policy_version(
                run_id,
                version,
                samples_trained=16 * version,
                tokens_trained=700 * version,
                created_at=at,
                checkpoint_path=str(run_dir / "checkpoints" / f"v{version:06d}")
                if version % CHECKPOINT_EVERY == 0
                else None,
                broadcast_ms=rng.uniform(20, 40),
                pause_ms=rng.uniform(5, 15),
            )
            by_position = [
                round(1.5 * (1 - b / POSITION_BUCKETS) + rng.uniform(0, 0.2), 3) for b in range(16)
            ]
            record = {
                registry.POLICY_VERSION: version,
                registry.LAG_BY_POSITION: by_position,
                registry.LAG_POSITION_BUCKET_SIZE: 8,
                registry.TRAINER_INFLIGHT_SEQUENCES: rng.randint(0, 12),
                registry.TIME: at.timestamp(),
            }
            metrics.write(json.dumps(record) + "\n")
        store.finish_run(
            run_id, "finished", started + timedelta(seconds=seconds_per_step * steps + 5), {"steps": steps}
        )
    return SyntheticRun(run_id, database_url, mlflow_uri, run_dir)


def _mlflow_run(
    uri: str,
    root: Path,
    experiment: str,
    run_id: str,
    steps: int,
    started: datetime,
    seconds_per_step: float,
    rng: random.Random,
) -> str:
    store = MlflowStore(uri, (root / "mlartifacts").as_uri())
    mlflow_run_id = store.start_run(experiment, run_id, {})
    points = []
    for version in range(1, steps + 1):
        at = started.timestamp() + seconds_per_step * version
        points += [
            MetricPoint(MLFLOW_METRICS[0], rng.uniform(400, 600), version, at),
            MetricPoint(MLFLOW_METRICS[1], rng.uniform(0.0, 0.2), version, at),
            MetricPoint(MLFLOW_METRICS[2], float(rng.randint(0, 40)), version, at),
        ]
    # Held-out evaluations every tenth of the run (and before it), one restart half-way.
    every = max(1, steps // EVALUATIONS)
    for version in range(0, steps + 1, every):
        at = started.timestamp() + seconds_per_step * version
        success = 0.2 + 0.5 * version / steps
        points.append(MetricPoint(EVAL_METRIC, success + rng.uniform(-0.02, 0.02), version, at))
    restart_at = started.timestamp() + seconds_per_step * (steps // 2)
    points.append(MetricPoint(registry.RUN_RESTARTS, 1.0, steps // 2, restart_at))
    store.log_metrics(mlflow_run_id, points)
    store.end_run(mlflow_run_id, "FINISHED")
    return mlflow_run_id


def fast_temporary_root() -> str | None:
    """Memory-backed ``/dev/shm`` where there is one: filling SQLite one transaction per step waits on
    fsync ten times longer on disk (reads, what is measured, come from the page cache either way)."""
    return "/dev/shm" if Path("/dev/shm").is_dir() else None


class BackgroundServer:
    """The dashboard under uvicorn in a thread of this process, on 127.0.0.1:``port``."""

    def __init__(self, settings: UiSettings, port: int) -> None:
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="dashboard", daemon=True)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the dashboard did not start on {self.url}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)


def time_requests(base_url: str, paths: list[str], repeats: int) -> dict[str, float]:
    """Median seconds per GET of each path (after one warm-up request each)."""
    timings: dict[str, float] = {}
    for path in paths:
        samples = []
        for attempt in range(repeats + 1):
            began = time.perf_counter()
            with urllib.request.urlopen(base_url + path, timeout=120) as response:
                response.read()
            if attempt:
                samples.append(time.perf_counter() - began)
        timings[path] = statistics.median(samples)
    return timings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--port", type=int, default=27250)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-mlflow", action="store_true", help="leave MLflow out (database and files only)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="pipelinerl-ui-bench-", dir=fast_temporary_root()) as tmp:
        began = time.perf_counter()
        run = fill_synthetic_run(Path(tmp), args.steps, with_mlflow=not args.no_mlflow)
        print(f"filled {args.steps} steps in {time.perf_counter() - began:.1f} s")
        settings = UiSettings(database_url=run.database_url, mlflow_uri=run.mlflow_uri)
        with BackgroundServer(settings, args.port) as server:
            paths = ["/", "/api/runs", *(p.format(run_id=run.run_id) for p in RUN_PAGE_REQUESTS)]
            timings = time_requests(server.url, paths, args.repeats)
    for path, seconds in timings.items():
        print(f"{1000 * seconds:8.1f} ms  GET {path}")
    run_page = sum(timings[p.format(run_id=run.run_id)] for p in RUN_PAGE_REQUESTS)
    print(f"{1000 * run_page:8.1f} ms  the run page and its five API calls, one after another")
    cpu = platform.processor() or platform.machine()
    print(f"machine: {platform.platform()}, {cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}")


if __name__ == "__main__":
    main()
