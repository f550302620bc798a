"""Register the platform's Prefect deployments: ``rl-run/default``, ``compare/default``,
``plan/default`` and ``sweep/default`` on the launch pool, and the per-role ``rl-role/trainers`` and
``rl-role/actors`` on the ``trainers`` and ``actors`` pools (what ``cluster.placement = "pools"`` submits to).

Each deployment loads its flow from this repository's directory (``flow.from_source`` with a local
path: the worker's pull step changes into the repository, nothing is copied or uploaded) and runs
on a process work pool (``local`` by default). The sweep deployment carries a cron schedule with
the sweep's parameters, created **inactive**: a nightly sweep runs only once someone enables it
(Prefect UI: the deployment's schedules, or ``prefect deployment schedule resume``).

The work pools ``actors`` and ``trainers`` (process type, for stages on other nodes) and the launch
pool are created when missing. ``prefect.yaml`` at the repository root declares the same
deployments for ``prefect deploy --all``; ``DEPLOYMENTS`` here is the one list both follow.

``python -m pipelinerl.flows.deploy --api-url URL`` registers them and prints one JSON line
(what ``pipelinerl up`` runs against the stack it started).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import logging
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

logger = logging.getLogger("pipelinerl.deploy")

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOYMENT_NAME = "default"
LAUNCH_POOL = "local"
# Work pool types the deployments may use: process (created when missing), or Docker and Kubernetes
# pools an administrator made with the job templates in flows/job_templates (docs/cluster.md).
POOL_TYPES = ("process", "docker", "kubernetes")
STAGE_POOLS = ("actors", "trainers")
DEFAULT_SWEEP_CRON = "0 3 * * *"  # 03:00 UTC every night, once enabled
SWEEP_SCHEDULE_SLUG = "nightly-sweep"
# What the nightly sweep varies by default: H, the sequences in flight per actor (paper section 5).
DEFAULT_SWEEP_PARAMETERS: dict[str, Any] = {
    "grid": {"actor.max_in_flight": [16, 32, 64]},
    "max_concurrency": 1,
}


class DeployError(RuntimeError):
    """The deployments cannot be registered; the message says why (meant for the user as is)."""


@dataclass(frozen=True)
class DeploymentSpec:
    flow_name: str
    entrypoint: str  # path relative to the repository root, ``file.py:function``
    description: str
    name: str = DEPLOYMENT_NAME
    pool: str | None = None  # None: the launch pool

    @property
    def full_name(self) -> str:
        return f"{self.flow_name}/{self.name}"

    @property
    def path(self) -> Path:
        return REPO_ROOT / self.entrypoint.split(":", 1)[0]


DEPLOYMENTS = (
    DeploymentSpec(
        "rl-run",
        "pipelinerl/flows/rl_run.py:rl_run",
        "One PipelineRL (or baseline) run: actor, preprocessor and trainer on the worker's machine.",
    ),
    DeploymentSpec(
        "compare",
        "pipelinerl/flows/compare.py:compare",
        "The same experiment once per mode, as child MLflow runs of one parent run.",
    ),
    DeploymentSpec(
        "plan",
        "pipelinerl/flows/plan_flow.py:plan",
        "Predict a configuration's speed and staleness on a cluster (a simulation), or sweep one setting.",
    ),
    DeploymentSpec(
        "sweep",
        "pipelinerl/flows/sweep.py:sweep",
        "A grid of config overrides, one child run per point; its nightly schedule starts disabled.",
    ),
    DeploymentSpec(
        "rl-role",
        "pipelinerl/flows/rl_role.py:rl_role",
        "One node's trainer ranks (and, on node 0, the preprocessor) of a run placed on the pools.",
        name="trainers",
        pool="trainers",
    ),
    DeploymentSpec(
        "rl-role",
        "pipelinerl/flows/rl_role.py:rl_role",
        "One node's actors of a run placed on the pools.",
        name="actors",
        pool="actors",
    ),
)


def available_deployments() -> tuple[list[DeploymentSpec], list[DeploymentSpec]]:
    """The deployments whose flow file exists in this checkout, and those skipped (file missing)."""
    present = [spec for spec in DEPLOYMENTS if spec.path.is_file()]
    missing = [spec for spec in DEPLOYMENTS if not spec.path.is_file()]
    return present, missing


def resolve_api_url(api_url: str | None) -> str:
    """``api_url``, else ``PREFECT_API_URL`` (environment or Prefect profile): a server must exist."""
    if api_url:
        return api_url.rstrip("/")
    from_env = os.environ.get("PREFECT_API_URL")
    if not from_env:
        from prefect.settings import PREFECT_API_URL

        from_env = PREFECT_API_URL.value()
    if not from_env:
        raise DeployError(
            "no Prefect server to deploy to: pass --api-url http://127.0.0.1:4200/api, set "
            "PREFECT_API_URL, or start one with `pipelinerl up`"
        )
    return from_env.rstrip("/")


def check_api(api_url: str, timeout_s: float = 10.0) -> None:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=timeout_s) as response:
            response.read()
    except (OSError, urllib.error.URLError) as error:
        reason = getattr(error, "reason", error)
        raise DeployError(f"the Prefect API at {api_url} is unreachable ({reason})") from None


def deploy(
    api_url: str | None = None,
    work_pool: str = LAUNCH_POOL,
    cron_sweep: str | None = None,
    sweep_parameters: Mapping[str, Any] | None = None,
) -> dict[str, str]:
    """Create the work pools if missing and register (or update) the deployments.

    ``cron_sweep`` is the sweep schedule's cron string (default ``DEFAULT_SWEEP_CRON``); the schedule
    is created inactive with ``sweep_parameters`` (default ``DEFAULT_SWEEP_PARAMETERS``). Returns
    ``{"rl-run/default": "<deployment id>", ...}``; a flow whose file is missing is skipped with a
    warning.
    """
    from prefect.settings import PREFECT_API_URL, temporary_settings

    url = resolve_api_url(api_url)
    check_api(url)
    with temporary_settings(updates={PREFECT_API_URL: url}):
        return asyncio.run(
            _deploy(
                url,
                work_pool,
                cron_sweep or DEFAULT_SWEEP_CRON,
                dict(DEFAULT_SWEEP_PARAMETERS if sweep_parameters is None else sweep_parameters),
            )
        )


async def _ensure_work_pools(client: Any, names: list[str]) -> None:
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    for name in names:
        try:
            pool = await client.read_work_pool(name)
        except ObjectNotFound:
            try:
                await client.create_work_pool(
                    WorkPoolCreate(
                        name=name,
                        type="process",
                        base_job_template=ProcessWorker.get_default_base_job_template(),
                    )
                )
                logger.info("created work pool %s (process)", name)
            except ObjectAlreadyExists:  # a worker created it meanwhile
                pass
            continue
        if pool.type not in POOL_TYPES:
            raise DeployError(
                f"work pool {name!r} exists with type {pool.type!r}; the platform's flows run on "
                f"{', '.join(POOL_TYPES)} pools (docs/cluster.md: job templates in flows/job_templates)"
            )
        if pool.type != "process":
            logger.info("work pool %s is a %s pool: its job template decides image and GPUs", name, pool.type)


async def _deploy(
    api_url: str, work_pool: str, cron: str, sweep_parameters: dict[str, Any]
) -> dict[str, str]:
    from prefect import Flow
    from prefect.client.orchestration import get_client
    from prefect.deployments.runner import adeploy
    from prefect.schedules import Cron

    present, missing = available_deployments()
    for spec in missing:
        logger.warning("skipping deployment %s: %s does not exist", spec.full_name, spec.path)
    pools = list(dict.fromkeys([*STAGE_POOLS, work_pool]))
    async with get_client() as client:
        await _ensure_work_pools(client, pools)
    deployments: dict[
        str, list[tuple[DeploymentSpec, Any]]
    ] = {}  # by work pool: adeploy sets one pool for all it is given
    for spec in present:
        flow = await Flow.afrom_source(source=str(REPO_ROOT), entrypoint=spec.entrypoint)
        schedules = None
        if spec.flow_name == "sweep":
            schedules = [
                Cron(
                    cron, timezone="UTC", active=False, parameters=sweep_parameters, slug=SWEEP_SCHEDULE_SLUG
                )
            ]
        pool = spec.pool or work_pool
        deployments.setdefault(pool, []).append(
            (
                spec,
                await flow.ato_deployment(
                    name=spec.name,
                    work_pool_name=pool,
                    schedules=schedules,
                    description=spec.description,
                    tags=["pipelinerl"],
                ),
            )
        )
    ids: dict[str, str] = {}
    for pool, group in deployments.items():
        report = io.StringIO()
        with contextlib.redirect_stdout(report):  # Prefect prints its own table; the caller reports ids
            created = await adeploy(
                *(deployment for _, deployment in group),
                work_pool_name=pool,
                build=False,
                push=False,
                print_next_steps_message=False,
                ignore_warnings=True,
            )
        logger.debug("%s", report.getvalue())
        ids.update({spec.full_name: str(i) for (spec, _), i in zip(group, created, strict=True)})
    return {spec.full_name: ids[spec.full_name] for spec in present}


def main(argv: list[str] | None = None) -> int:
    """``python -m pipelinerl.flows.deploy [--api-url URL] [--work-pool NAME] [--cron CRON]``."""
    parser = argparse.ArgumentParser(prog="python -m pipelinerl.flows.deploy", description=__doc__)
    parser.add_argument("--api-url", default=None)
    parser.add_argument("--work-pool", default=LAUNCH_POOL)
    parser.add_argument("--cron", default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stderr)
    try:
        ids = deploy(args.api_url, work_pool=args.work_pool, cron_sweep=args.cron)
    except DeployError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    print(json.dumps(ids))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
