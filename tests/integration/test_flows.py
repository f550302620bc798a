"""The sweep flow and the deployment's work pools, under one Prefect test harness shared by the module.
(A real ``rl-run`` flow run, with its artifacts, stage logs and MLflow tag, is in ``test_stack.py``:
the stack's deployment runs carry those properties; the flows' parameter forms are unit tests,
``tests/unit/flows/test_parameter_forms.py``.)"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from prefect.client.orchestration import get_client
from prefect.client.schemas.actions import WorkPoolCreate
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
from prefect.testing.utilities import prefect_test_harness

from pipelinerl.flows.deploy import DeployError, _ensure_work_pools
from pipelinerl.flows.plan_flow import plan
from pipelinerl.flows.sweep import sweep
from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking.mlflow_store import mlflow_uri
from tests.conftest import worker_port


@pytest.fixture(scope="module")
def prefect_harness() -> Iterator[None]:
    """One temporary Prefect server (``prefect_test_harness``) for the module's flow runs and pools."""
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.mark.slow
def test_two_point_sweep_makes_two_child_runs_under_one_parent(prefect_harness, tmp_path, random_model_dir):
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path / 'runs'}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=2",
            "rl.batch_size=16",
            "actor.max_in_flight=16",
            "task.eval_problems=8",
            f"transport.base_port={worker_port(22650)}",
        ],
    )
    # Both points at once (each in its own block of ports): the sweep's concurrency, and half the wait.
    rows = sweep(config=config, grid={"trainer.learning_rate": [1e-5, 1e-4]}, max_concurrency=2)
    assert [row["point"] for row in rows] == ["learning_rate=1e-05", "learning_rate=0.0001"]
    client = MlflowClient(tracking_uri=mlflow_uri(config))
    experiment = client.get_experiment_by_name(config.run.name)
    parents = client.search_runs([experiment.experiment_id], filter_string="tags.kind = 'sweep'")
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"
    children = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.mlflow.parentRunId = '{parents[0].info.run_id}'"
    )
    assert sorted(child.data.params["trainer.learning_rate"] for child in children) == ["0.0001", "1e-05"]
    assert all(child.info.status == "FINISHED" for child in children)
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id, "figures")}
    assert "figures/sweep.png" in artifacts


def test_deploy_accepts_the_docker_and_kubernetes_pools_the_cluster_guide_creates(prefect_harness):
    """docs/cluster.md has administrators create the stage pools as Docker or Kubernetes pools from the
    job templates in flows/job_templates; deploying onto them must work, and another type is named."""
    templates = Path(__file__).resolve().parents[2] / "pipelinerl" / "flows" / "job_templates"

    async def check() -> None:
        async with get_client() as client:
            for name, kind in (("trainers", "kubernetes"), ("actors", "docker")):
                template = json.loads((templates / f"{kind}.json").read_text())
                await client.create_work_pool(
                    WorkPoolCreate(name=name, type=kind, base_job_template=template)
                )
            await _ensure_work_pools(client, ["trainers", "actors", "local"])  # local is created
            assert (await client.read_work_pool("local")).type == "process"
            await client.create_work_pool(WorkPoolCreate(name="odd", type="ecs", base_job_template={}))
            with pytest.raises(
                DeployError, match="'odd' exists with type 'ecs'.*process, docker, kubernetes"
            ):
                await _ensure_work_pools(client, ["odd"])

    asyncio.run(check())


def test_the_plan_flow_sweeps_the_split_and_leaves_its_artifacts_and_the_saved_plan(
    prefect_harness, tmp_path
):
    """The ``plan`` flow as the Prefect form runs it: a sweep of the split of 16 H100s for a 7B run, with
    its table and summary artifacts, the plan saved under the home (for the dashboard) and its figure."""
    config = load_config(
        None, [f"run.home={tmp_path / 'home'}", "rl.batch_size=64", "rl.group_size=8", "run.max_steps=8"]
    )
    result = plan(
        config=config,
        profile="h100-7b",
        lengths="loglogistic:300,900",
        cluster="actors=8xH100,trainers=8xH100",
        sweep="actor_gpus=4..12:4",
        modes=["pipeline", "colocated"],
    )
    assert [point["value"] for point in result["points"]] == [4, 8, 12]
    assert result["recommended"] in (4, 8, 12) and result["reason"].startswith("actor_gpus=")
    (saved,) = (tmp_path / "home" / "plans").glob("*-sweep.json")
    assert json.loads(saved.read_text())["recommended"] == result["recommended"]
    assert saved.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"

    async def artifacts() -> dict[str, object]:
        async with get_client() as client:
            keys = ["plan-table", "plan-summary"]
            found = await client.read_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=keys))
            )
            return {artifact.key: artifact.data for artifact in found}

    found = asyncio.run(artifacts())
    table = json.loads(found["plan-table"]) if isinstance(found["plan-table"], str) else found["plan-table"]
    assert {(row["actor_gpus"], row["mode"]) for row in table} == {
        (value, mode) for value in (4, 8, 12) for mode in ("pipeline", "colocated")
    }
    assert f"Recommended: actor_gpus={result['recommended']}" in str(found["plan-summary"])
