"""The ``rl-run`` flow: its parameter form, and a real run under Prefect's test harness."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelinerl.flows.rl_run import rl_run
from pipelinerl.platform.config import load_config
from tests.conftest import worker_port


def test_parameter_form_shows_config_fields_with_descriptions():
    from prefect.utilities.callables import parameter_schema

    schema = parameter_schema(rl_run).model_dump()
    definitions = schema["definitions"]
    run_section = definitions["RunConfig"]["properties"]
    assert run_section["mode"]["enum"] == ["pipeline", "conventional", "async"]  # a dropdown
    assert "in-flight" in run_section["mode"]["description"]
    assert run_section["max_steps"]["minimum"] == 1
    rl_section = definitions["RLConfig"]["properties"]
    assert rl_section["group_size"]["description"].startswith("Samples per prompt")
    assert set(definitions["PipelineConfig"]["properties"]) >= {
        "run",
        "model",
        "actor",
        "rl",
        "trainer",
        "tracking",
    }
    for section in ("RunConfig", "ActorConfig", "RLConfig", "TrainerConfig", "TrackingConfig"):
        for name, field in definitions[section]["properties"].items():
            assert field.get("description"), f"{section}.{name} has no description"


def test_every_form_parameter_is_described_and_no_description_hides_a_placeholder():
    """Prefect's form renders descriptions as markdown, where ``<run-id>`` is swallowed as a tag."""
    import re

    from prefect.utilities.callables import parameter_schema

    from pipelinerl.flows.compare import compare
    from pipelinerl.flows.sweep import sweep

    for flow in (rl_run, compare, sweep):
        schema = parameter_schema(flow).model_dump()
        for name, parameter in schema["properties"].items():
            assert parameter.get("description"), f"{flow.name}: parameter {name} has no description"
        sections = [schema["properties"], *(d.get("properties", {}) for d in schema["definitions"].values())]
        for properties in sections:
            for name, field in properties.items():
                text = field.get("description", "")
                assert not re.search(r"<[A-Za-z][\w-]*>", text), f"{flow.name}: {name}: {text!r}"
    assert parameter_schema(compare).model_dump()["properties"]["modes"]["minItems"] == 2


@pytest.mark.slow
def test_rl_run_flow_runs_the_pipeline(tmp_path, random_model_dir):
    from mlflow.tracking import MlflowClient
    from prefect.client.orchestration import get_client
    from prefect.testing.utilities import prefect_test_harness

    from pipelinerl.platform.tracking.mlflow_store import mlflow_uri

    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={tmp_path / 'runs'}",
            f"run.home={tmp_path / 'home'}",
            "run.max_steps=3",
            "rl.batch_size=16",
            "actor.max_in_flight=16",
            "task.eval_problems=16",
            f"transport.base_port={worker_port(22500)}",
        ],
    )
    with prefect_test_harness(server_startup_timeout=120):
        state = rl_run(config=config, return_state=True)
        assert state.is_completed(), state
        summary = state.result()
        assert summary["steps"] == 3 and summary["final_policy_version"] == 3
        flow_run_id = state.state_details.flow_run_id

        import anyio

        async def read() -> tuple[list, list, object]:
            async with get_client() as client:
                from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

                artifacts = await client.read_artifacts(
                    artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
                )
                logs = await client.read_logs()
                run = await client.read_flow_run(flow_run_id)
            return artifacts, logs, run

        artifacts, logs, finished_run = anyio.run(read)
    by_key = {artifact.key: artifact for artifact in artifacts}
    assert by_key["rl-run-progress"].type == "table"
    assert "MLflow run" in by_key["rl-run-mlflow"].data
    assert finished_run.end_time is not None
    messages = [log.message for log in logs if log.flow_run_id == flow_run_id]
    assert any(message.startswith("[trainer0]") for message in messages), "stage logs reach Prefect"
    assert any(message.startswith("[actor0]") for message in messages)

    run_dir = tmp_path / "runs" / summary["run_id"]
    # Published while the run ran (once its MLflow run existed), not only after it ended: before the
    # launcher wrote the run's summary.json, its last act.
    from datetime import UTC, datetime

    summary_written = datetime.fromtimestamp((run_dir / "summary.json").stat().st_mtime, UTC)
    assert by_key["rl-run-mlflow"].created < summary_written
    client = MlflowClient(tracking_uri=mlflow_uri(config))
    mlflow_run = client.get_run((run_dir / "mlflow_run_id").read_text())
    assert mlflow_run.data.tags["prefect_flow_run_id"] == str(flow_run_id)


@pytest.mark.slow
def test_two_point_sweep_makes_two_child_runs_under_one_parent(tmp_path, random_model_dir):
    from mlflow.tracking import MlflowClient
    from prefect.testing.utilities import prefect_test_harness

    from pipelinerl.flows.sweep import sweep
    from pipelinerl.platform.tracking.mlflow_store import mlflow_uri

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
    with prefect_test_harness(server_startup_timeout=120):
        rows = sweep(config=config, grid={"trainer.learning_rate": [1e-5, 1e-4]})
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


def test_deploy_accepts_the_docker_and_kubernetes_pools_the_cluster_guide_creates():
    """docs/cluster.md has administrators create the stage pools as Docker or Kubernetes pools from the
    job templates in flows/job_templates; deploying onto them must work, and another type is named."""
    import asyncio
    import json

    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.testing.utilities import prefect_test_harness

    from pipelinerl.flows.deploy import DeployError, _ensure_work_pools

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

    with prefect_test_harness(server_startup_timeout=120):
        asyncio.run(check())
