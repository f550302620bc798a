"""The deployment files: docker-compose.yml, the images' Dockerfiles, the PostgreSQL init script and the
Prefect base job templates of the ``actors`` and ``trainers`` work pools (docs/cluster.md).

Fast and offline: YAML and JSON are parsed and checked for what the stack relies on; the job templates
go through Prefect's own server-side checks and templating. ``docker compose config`` runs only where
a compose CLI is installed.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from prefect.client.schemas.objects import FlowRun
from prefect.server.schemas.actions import validate_base_job_template
from prefect.utilities.schema_tools.validation import ValidationError, is_valid_schema, validate
from prefect.utilities.templating import apply_values, find_placeholders

from pipelinerl.flows.deploy import DEPLOYMENTS, LAUNCH_POOL
from pipelinerl.platform.config import PORTS, TransportConfig

ROOT = Path(__file__).resolve().parents[3]
COMPOSE_FILE = ROOT / "docker-compose.yml"
INIT_SQL = ROOT / "docker" / "postgres-init.sql"
TEMPLATES_DIR = ROOT / "pipelinerl" / "flows" / "job_templates"
TEMPLATES = {kind: TEMPLATES_DIR / f"{kind}.json" for kind in ("kubernetes", "docker")}
CLUSTER_DOC = ROOT / "docs" / "cluster.md"

DATABASES = {"prefect", "mlflow", "pipelinerl"}
WORKERS = {"actor-worker": ("actors", "ACTOR_GPUS"), "trainer-worker": ("trainers", "TRAINER_GPUS")}
PASSWORD = "${POSTGRES_PASSWORD:-pipelinerl}"  # the documented development default, nothing else
# Values a run could pass: a GPU count other than the default, its own environment and labels.
RUN_VARIABLES = {
    "image": "registry.example.com/pipelinerl/trainer:0.1.0",
    "gpus": 8,
    "env": {"MLFLOW_TRACKING_URI": "http://mlflow:5000"},
    "labels": {"team": "rl"},
}


# --------------------------------------------------------------------------------------------------
# docker-compose.yml


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def _environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {key: str(value) for key, value in env.items()}


def _command(service: dict[str, Any]) -> list[str]:
    command = service.get("command") or []
    return command.split() if isinstance(command, str) else [str(part) for part in command]


def _database(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def test_compose_is_a_compose_spec_file_with_every_service(compose):
    assert "version" not in compose, "the compose specification has no `version:` key"
    assert {"postgres", "prefect-server", "mlflow-server", *WORKERS} <= set(compose["services"])
    # The shared environment is one anchor that every worker merges.
    shared = compose["x-pipelinerl-env"]
    for name in WORKERS:
        assert shared.items() <= _environment(compose["services"][name]).items(), name


def test_postgres_is_one_server_with_an_init_script_a_volume_and_a_healthcheck(compose):
    postgres = compose["services"]["postgres"]
    # The official image by default; scripts/compose-base.sh's local one where none can be pulled.
    assert postgres["image"] == "${POSTGRES_IMAGE:-postgres:15}"
    mounts = [str(volume) for volume in postgres["volumes"]]
    assert any(
        mount.startswith("./docker/postgres-init.sql:/docker-entrypoint-initdb.d/") for mount in mounts
    )
    named = {mount.split(":", 1)[0] for mount in mounts if not mount.startswith((".", "/"))}
    assert named and named <= set(compose["volumes"]), "the data directory is a declared named volume"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    # Were POSTGRES_DB one of the three, the image would create it and the init script would fail.
    assert _environment(postgres).get("POSTGRES_DB", "postgres") not in DATABASES


def test_init_script_creates_exactly_the_three_databases():
    sql = re.sub(r"--[^\n]*", "", INIT_SQL.read_text())
    created = re.findall(r"create\s+database\s+\"?(\w+)\"?", sql, flags=re.IGNORECASE)
    assert sorted(created) == sorted(DATABASES)


def test_each_server_points_at_its_own_database(compose):
    services = compose["services"]
    prefect_url = _environment(services["prefect-server"])["PREFECT_API_DATABASE_CONNECTION_URL"]
    mlflow_command = _command(services["mlflow-server"])
    mlflow_url = mlflow_command[mlflow_command.index("--backend-store-uri") + 1]
    platform_url = compose["x-pipelinerl-env"]["PIPELINERL_DATABASE_URL"]

    assert urlsplit(prefect_url).scheme == "postgresql+asyncpg"
    assert urlsplit(mlflow_url).scheme == urlsplit(platform_url).scheme == "postgresql"
    urls = {"prefect": prefect_url, "mlflow": mlflow_url, "pipelinerl": platform_url}
    for database, url in urls.items():
        assert _database(url) == database, url
        assert urlsplit(url).hostname == "postgres", url
    assert _environment(services["prefect-server"])["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert _environment(services["mlflow-server"])["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] == "false"
    assert mlflow_command[mlflow_command.index("--artifacts-destination") + 1] == "/mlartifacts"
    assert any(str(v).endswith(":/mlartifacts") for v in services["mlflow-server"]["volumes"])


def test_no_password_is_written_down_but_the_documented_default():
    text = COMPOSE_FILE.read_text()
    credentials = re.findall(r"postgresql(?:\+\w+)?://[^:/@\s]+:([^@\s]+)@", text)
    assert credentials and set(credentials) == {PASSWORD}
    assert re.findall(r"^\s*POSTGRES_PASSWORD:\s*(\S+)", text, flags=re.MULTILINE) == [PASSWORD]


@pytest.mark.parametrize("name", sorted(WORKERS))
def test_workers_name_their_pool_and_reserve_nvidia_gpus(compose, name):
    pool, gpu_variable = WORKERS[name]
    service = compose["services"][name]
    command = _command(service)
    assert command[-7:] == ["worker", "start", "--pool", pool, "--type", "process", "--with-healthcheck"]
    assert command[0].endswith("prefect")
    assert "8080/health" in " ".join(service["healthcheck"]["test"]), "the worker's own health server"
    assert service["profiles"] == ["gpu"], "`docker compose up` on a machine without GPUs leaves it out"

    env = _environment(service)
    assert env["PREFECT_API_URL"] == "http://prefect-server:4200/api"
    assert env["MLFLOW_TRACKING_URI"] == "http://mlflow-server:5000"
    assert _database(env["PIPELINERL_DATABASE_URL"]) == "pipelinerl"

    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia"
    assert "gpu" in device["capabilities"]
    assert str(device["count"]) == f"${{{gpu_variable}:-1}}"


def test_the_actor_runs_in_the_vllm_image_and_the_trainer_shares_host_ipc(compose):
    actor, trainer = compose["services"]["actor-worker"], compose["services"]["trainer-worker"]
    assert actor["build"]["dockerfile"] == "docker/Dockerfile.vllm"
    assert str(actor["shm_size"]).lower() == "16gb"
    assert trainer["build"]["dockerfile"] == "docker/Dockerfile"
    assert trainer["ipc"] == "host"


def test_every_service_has_an_image_or_a_build_that_exists(compose):
    for name, service in compose["services"].items():
        assert service.get("image") or service.get("build"), f"{name} has neither image nor build"
        build = service.get("build")
        if build:
            if isinstance(build, str):
                build = {"context": build}
            context = ROOT / build.get("context", ".")
            assert (context / build.get("dockerfile", "Dockerfile")).is_file(), name


def test_every_dependency_is_a_service(compose):
    services = compose["services"]
    conditions = {"service_started", "service_healthy", "service_completed_successfully"}
    for name, service in services.items():
        depends_on = service.get("depends_on") or {}
        for dependency in depends_on:
            assert dependency in services, f"{name} depends on unknown service {dependency!r}"
            if isinstance(depends_on, dict):
                condition = depends_on[dependency].get("condition", "service_started")
                assert condition in conditions, (name, dependency, condition)
                if condition == "service_healthy":
                    assert "healthcheck" in services[dependency], f"{dependency} has no healthcheck"


ONE_SHOT = {"db-migrate"}  # runs the migrations and exits; the others serve


def test_every_serving_service_has_a_healthcheck_and_a_restart_policy(compose):
    for name, service in compose["services"].items():
        if name in ONE_SHOT:
            assert service["restart"] == "no", name
            continue
        assert service.get("healthcheck", {}).get("test"), f"{name} has no health check"
        assert service["restart"] == "unless-stopped", name


def test_the_data_lives_in_named_volumes(compose):
    services = compose["services"]
    for name, target in [
        ("postgres", "/var/lib/postgresql/data"),
        ("mlflow-server", "/mlartifacts"),
        ("launch-worker", "/app/runs"),
        ("launch-worker", "/home/pipelinerl/.pipelinerl"),
    ]:
        mounts = {str(m).split(":")[1]: str(m).split(":")[0] for m in services[name]["volumes"]}
        assert mounts.get(target) in compose["volumes"], (name, target, mounts)


def test_only_the_gpu_workers_are_behind_the_gpu_profile(compose):
    profiled = {name for name, service in compose["services"].items() if service.get("profiles")}
    assert profiled == set(WORKERS)


def test_the_platform_build_takes_its_base_image_and_network_from_the_environment(compose):
    """Where no registry is reachable, scripts/compose-base.sh's images replace the official ones."""
    for name in ("prefect-server", "trainer-worker"):
        build = compose["services"][name]["build"]
        assert build["args"]["PYTHON_IMAGE"] == "${PYTHON_IMAGE:-python:3.11-slim}", name
        assert build["network"] == "${BUILD_NETWORK:-default}", name


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.vllm", "postgres/Dockerfile"])
def test_images_run_as_a_user_other_than_root_and_bake_in_no_secret(dockerfile):
    lines = (ROOT / "docker" / dockerfile).read_text().splitlines()
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("root", "0"), f"{dockerfile} runs as {users[-1:] or 'root'}"
    settings = [line for line in lines if line.startswith(("ENV ", "ARG ")) or line.startswith("    ")]
    assert not [line for line in settings if re.search(r"PASSWORD|SECRET|TOKEN", line, re.IGNORECASE)]


def test_the_build_context_leaves_out_runs_and_environments():
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    ignored = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    assert {".git", ".venv", ".venv-*", "runs"} <= ignored
    assert not any(pattern.startswith("docker") for pattern in ignored), "docker/wheels is in the context"


def _compose_cli() -> list[str] | None:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if shutil.which("docker"):
        probe = subprocess.run(["docker", "compose", "version"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return ["docker", "compose"]
    return None


@pytest.mark.parametrize("profile", [None, "gpu"])
def test_compose_cli_accepts_the_file(profile):
    """The compose implementation's own validation, with and without the GPU profile (which services
    each starts is the file's profiles, above: docker-compose 1.29 lists every service either way)."""
    cli = _compose_cli()
    if cli is None:
        pytest.skip("neither docker-compose nor the docker compose plugin is installed")
    profiles = ["--profile", profile] if profile else []
    result = subprocess.run(
        [*cli, "-f", str(COMPOSE_FILE), *profiles, "config", "--services"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert set(WORKERS) <= set(result.stdout.split()) and "launch-worker" in result.stdout


# --------------------------------------------------------------------------------------------------
# Dockerfiles


def _copied_sources(dockerfile: Path) -> list[str]:
    sources = []
    for line in dockerfile.read_text().splitlines():
        parts = line.split()
        if parts and parts[0] == "COPY" and not any(p.startswith("--from") for p in parts):
            sources += parts[1:-1]
    return sources


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.vllm"])
def test_dockerfiles_copy_only_files_that_exist(dockerfile):
    sources = _copied_sources(ROOT / "docker" / dockerfile)
    assert "pyproject.toml" in sources and "pipelinerl/" in sources and "migrations/" in sources
    for source in sources:
        assert (ROOT / source).exists(), f"{dockerfile} copies {source}, which is missing"


def test_platform_image_installs_torch_first_then_everything():
    text = (ROOT / "docker" / "Dockerfile").read_text()
    assert "python:3.11-slim" in text
    torch_at = text.index("https://download.pytorch.org/whl/${TORCH_VARIANT}")
    assert torch_at < text.index('.[all]"')
    assert "ARG TORCH_VERSION=2.13.0" in text and "ARG TORCH_VARIANT=cpu" in text


def test_vllm_image_keeps_vllms_environment_to_the_base_dependencies():
    text = (ROOT / "docker" / "Dockerfile.vllm").read_text()
    assert re.search(r"^ARG VLLM_VERSION=\S+", text, flags=re.MULTILINE)
    assert "FROM ${VLLM_IMAGE}:${VLLM_VERSION}" in text and "ARG VLLM_IMAGE=vllm/vllm-openai" in text
    assert "install --no-deps -e ." in text
    assert "['project']['dependencies']" in text
    # The extras go to the worker's own environment only, never into vLLM's python3.
    for line in text.splitlines():
        if "[platform]" in line or "[all]" in line:
            assert "/opt/platform/bin/pip" in line, line


# --------------------------------------------------------------------------------------------------
# Prefect base job templates


def _load(kind: str) -> dict[str, Any]:
    return json.loads(TEMPLATES[kind].read_text())


def _defaults(template: dict[str, Any]) -> dict[str, Any]:
    properties = template["variables"]["properties"]
    return {name: copy.deepcopy(spec["default"]) for name, spec in properties.items() if "default" in spec}


def _render(template: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """What a worker builds its job from: the defaults, overridden by the run's job variables."""
    variables = _defaults(template) | values
    validate(variables, template["variables"], raise_on_error=True, allow_none_with_default=True)
    return apply_values(copy.deepcopy(template["job_configuration"]), variables)


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_template_passes_prefects_own_checks(kind):
    template = _load(kind)
    assert set(template) == {"job_configuration", "variables"}
    validate_base_job_template(template)  # what the server runs on `prefect work-pool create`
    schema = template["variables"]
    is_valid_schema(schema, preprocess=False)
    assert schema["type"] == "object"
    assert {"gpus", "image", "shm_size"} <= set(schema["properties"])
    # The defaults satisfy the schema (what the server checks when the pool is saved).
    validate(
        _defaults(template), schema, raise_on_error=True, ignore_required=True, allow_none_with_default=True
    )


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_every_placeholder_has_a_variable_and_every_variable_is_used(kind):
    template = _load(kind)
    used = {placeholder.name for placeholder in find_placeholders(template["job_configuration"])}
    declared = set(template["variables"]["properties"])
    assert used - declared == set(), "placeholders without a variable"
    assert declared - used == set(), "variables no placeholder uses"


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_template_renders_without_leftover_placeholders(kind):
    rendered = _render(_load(kind), RUN_VARIABLES)
    assert not find_placeholders(rendered)
    # Plain JSON all the way down (a value left unset would be Prefect's NotSet sentinel).
    assert json.loads(json.dumps(rendered)) == rendered
    assert rendered["env"] == RUN_VARIABLES["env"] and rendered["labels"] == RUN_VARIABLES["labels"]


@pytest.mark.parametrize("kind", sorted(TEMPLATES))
def test_image_is_required(kind):
    template = _load(kind)
    assert template["variables"]["required"] == ["image"]
    without_image = {key: value for key, value in RUN_VARIABLES.items() if key != "image"}
    with pytest.raises(ValidationError, match="image"):
        _render(template, without_image)


def test_kubernetes_job_requests_gpus_and_a_memory_backed_shm():
    config = _render(_load("kubernetes"), RUN_VARIABLES | {"shm_size": "64Gi", "namespace": "rl"})
    manifest = config["job_manifest"]
    assert manifest["kind"] == "Job" and manifest["metadata"]["namespace"] == config["namespace"] == "rl"
    pod = manifest["spec"]["template"]["spec"]
    # Prefect's Kubernetes worker rejects a manifest whose pod template says anything else here.
    assert pod["parallelism"] == pod["completions"] == 1 and pod["restartPolicy"] == "Never"
    (container,) = pod["containers"]
    assert container["name"] == "prefect-job"
    assert container["image"] == RUN_VARIABLES["image"]
    assert container["resources"]["requests"]["nvidia.com/gpu"] == 8
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    (shm,) = [volume for volume in pod["volumes"] if volume.get("emptyDir", {}).get("medium") == "Memory"]
    assert shm["emptyDir"]["sizeLimit"] == "64Gi"
    assert {"name": shm["name"], "mountPath": "/dev/shm"} in container["volumeMounts"]
    # Annotation values must be strings: nodes and gpus travel as "<nodes>x<gpus>".
    assert manifest["metadata"]["annotations"]["pipelinerl.io/topology"] == "1x8"


def test_kubernetes_nodes_is_the_roles_node_count():
    manifest = _render(_load("kubernetes"), RUN_VARIABLES | {"nodes": 4})["job_manifest"]
    assert manifest["metadata"]["annotations"]["pipelinerl.io/topology"] == "4x8"
    with pytest.raises(ValidationError, match="nodes"):
        _render(_load("kubernetes"), RUN_VARIABLES | {"nodes": 0})


def test_prefect_yaml_declares_the_same_deployments_as_deploy_py():
    declared = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    assert sorted((d["entrypoint"], d["name"], d["work_pool"]["name"]) for d in declared) == sorted(
        (spec.entrypoint, spec.name, spec.pool or LAUNCH_POOL) for spec in DEPLOYMENTS
    )


def test_docker_container_gets_nvidia_gpus_and_shm():
    config = _render(_load("docker"), RUN_VARIABLES | {"gpus": -1, "shm_size": "32g"})
    assert config["image"] == RUN_VARIABLES["image"]
    kwargs = config["container_create_kwargs"]
    (request,) = kwargs["device_requests"]
    assert request == {"driver": "nvidia", "count": -1, "capabilities": [["gpu"]]}
    assert kwargs["shm_size"] == "32g"
    docker_types = pytest.importorskip("docker.types", reason="docker-py checks the Docker API shape")
    host_config = docker_types.HostConfig(version="1.43", **kwargs)
    assert host_config["DeviceRequests"][0]["Driver"] == "nvidia"
    assert host_config["ShmSize"] == 32 * 1024**3


def test_kubernetes_worker_accepts_the_rendered_job():
    worker = pytest.importorskip("prefect_kubernetes.worker", reason="prefect-kubernetes is not installed")

    configuration = worker.KubernetesWorkerJobConfiguration(**_render(_load("kubernetes"), RUN_VARIABLES))
    configuration.prepare_for_flow_run(FlowRun(name="brave-otter", flow_id="0" * 32))
    container = configuration.job_manifest["spec"]["template"]["spec"]["containers"][0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == 8
    assert {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow:5000"} in container["env"]


def test_docker_worker_accepts_the_rendered_container():
    worker = pytest.importorskip("prefect_docker.worker", reason="prefect-docker is not installed")
    configuration = worker.DockerWorkerJobConfiguration(**_render(_load("docker"), RUN_VARIABLES))
    assert configuration.container_create_kwargs["device_requests"][0]["count"] == 8


# --------------------------------------------------------------------------------------------------
# docs/cluster.md stays in step with the files


def test_cluster_guide_names_the_templates_and_the_transport_ports():
    text = CLUSTER_DOC.read_text()
    for kind, path in TEMPLATES.items():
        template = re.escape(path.relative_to(ROOT).as_posix())
        for pool in ("actors", "trainers"):
            command = rf"prefect work-pool create {pool}\s+--type {kind} --base-job-template {template}"
            assert re.search(command, text), command
    assert f"`transport.base_port` ({TransportConfig().base_port}) + 0" in text
    assert f"+ {len(PORTS)} + r" in text, "trainer inboxes follow the fixed ports"
    assert "docker compose up" in text


def test_compose_has_a_worker_for_the_launch_pool_the_run_deployments_use(compose):
    launchers = [
        name
        for name, service in compose["services"].items()
        if _command(service)[-5:-1] == ["--pool", LAUNCH_POOL, "--type", "process"]
    ]
    assert launchers == ["launch-worker"], launchers
    service = compose["services"]["launch-worker"]
    assert compose["x-pipelinerl-env"].items() <= _environment(service).items()
    assert "deploy" not in service and "profiles" not in service, "a launcher needs no GPU"


def test_compose_serves_the_dashboard_read_only_on_the_bind_address(compose):
    service = compose["services"]["dashboard"]
    command = _command(service)
    assert command[:2] == ["pipelinerl", "ui"] and command[command.index("--host") + 1] == "0.0.0.0"
    assert service["ports"] == ["${PIPELINERL_BIND:-127.0.0.1}:8300:8300"]
    assert all(volume.endswith(":ro") for volume in service["volumes"]), "the dashboard only reads"
    assert compose["x-pipelinerl-env"].items() <= _environment(service).items()
