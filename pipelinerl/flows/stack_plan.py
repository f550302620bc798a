"""The local stack's plan, without I/O: the state file model, paths, URLs, command lines and
environments of the processes ``flows/stack.py`` starts, and the order it stops them in."""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field

from pipelinerl.flows.deploy import STAGE_POOLS

HOST = "127.0.0.1"
DEFAULT_PREFECT_PORT = 4200
DEFAULT_MLFLOW_PORT = 5000
DEFAULT_UI_PORT = 8300
STARTUP_TIMEOUT_S = 180.0  # per service; a loaded 2-core machine needs far more than the usual 10 s
DEPLOY_TIMEOUT_S = 300.0
STOP_GRACE_S = 20.0
LOG_TAIL_LINES = 30

Role = Literal["prefect-server", "mlflow-server", "worker", "dashboard"]


class StackError(RuntimeError):
    """The stack cannot be started or stopped; the message is meant for the user as is."""


class StackProcess(BaseModel):
    name: str = Field(description="prefect-server, mlflow-server or worker-<pool>.")
    role: Role
    pid: int
    pgid: int = Field(description="Its process group (the process leads a new session).")
    create_time: float = Field(description="psutil create time: tells the process from a reused pid.")
    stop_signal: Literal["SIGINT", "SIGTERM"]
    command: list[str]
    log: Path


class StackState(BaseModel):
    home: Path
    prefect_port: int
    mlflow_port: int
    prefect_api_url: str
    prefect_ui_url: str
    mlflow_url: str
    mlflow_store_uri: str
    artifacts_dir: Path
    launch_pool: str
    work_pools: list[str]
    deployments: dict[str, str] = Field(default_factory=dict)
    processes: list[StackProcess] = Field(default_factory=list)
    dashboard_url: str | None = Field(None, description="The dashboard (`pipelinerl ui`), if started.")
    started_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    ready: bool = Field(False, description="False while `up` is still starting it.")


# ----- pure parts: paths, URLs, command lines, environments -----


def stack_dir(home: Path) -> Path:
    return home / "stack"


def state_path(home: Path) -> Path:
    return stack_dir(home) / "state.json"


def logs_dir(home: Path) -> Path:
    return stack_dir(home) / "logs"


def default_store_uri(home: Path) -> str:
    """The platform's default MLflow store (``tracking.mlflow_uri`` unset): SQLite in the home."""
    return f"sqlite:///{home / 'mlflow.db'}"


def prefect_api_url(port: int) -> str:
    return f"http://{HOST}:{port}/api"


def prefect_ui_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def mlflow_url(port: int) -> str:
    return f"http://{HOST}:{port}"


def tool(name: str) -> str:
    """A console script of this environment (``prefect``, ``mlflow``), next to the interpreter."""
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else name


def prefect_server_command(port: int) -> list[str]:
    return [tool("prefect"), "server", "start", "--host", HOST, "--port", str(port)]


def mlflow_upgrade_command(store_uri: str) -> list[str]:
    return [tool("mlflow"), "db", "upgrade", store_uri]


def mlflow_server_command(store_uri: str, artifacts_dir: Path, port: int) -> list[str]:
    return [
        tool("mlflow"),
        "server",
        "--backend-store-uri",
        store_uri,
        "--artifacts-destination",
        str(artifacts_dir),
        "--host",
        HOST,
        "--port",
        str(port),
        "--workers",
        "1",
    ]


def worker_name(pool: str) -> str:
    return f"{pool}-worker"


def worker_command(pool: str) -> list[str]:
    return [
        tool("prefect"),
        "worker",
        "start",
        "--pool",
        pool,
        "--type",
        "process",
        "--name",
        worker_name(pool),
    ]


def dashboard_command(home: Path, port: int, mlflow_ui: str, prefect_ui: str) -> list[str]:
    """`pipelinerl ui` on the stack's stores (its environment names them, as for the workers)."""
    return [
        sys.executable,
        "-m",
        "pipelinerl.cli",
        "ui",
        "--port",
        str(port),
        "--mlflow-ui-url",
        mlflow_ui,
        "--prefect-ui-url",
        prefect_ui,
        "--set",
        f"run.home={home}",
    ]


def deploy_command(api_url: str, pool: str) -> list[str]:
    return [sys.executable, "-m", "pipelinerl.flows.deploy", "--api-url", api_url, "--work-pool", pool]


def stack_env(
    base: Mapping[str, str], home: Path, prefect_port: int, mlflow_port: int, role: Role
) -> dict[str, str]:
    """The environment of one stack process: its Prefect home and API, and for workers (hence the
    flow runs they start) the stack's MLflow server and the platform database in the home."""
    env = dict(base)
    env.update(
        PREFECT_HOME=str(home / "prefect"),
        PREFECT_API_URL=prefect_api_url(prefect_port),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PYTHONUNBUFFERED="1",
    )
    if role == "mlflow-server":
        env = mlflow_server_env(env)
    elif role in ("worker", "dashboard"):
        env["MLFLOW_TRACKING_URI"] = mlflow_url(mlflow_port)
        env.setdefault("PIPELINERL_DATABASE_URL", f"sqlite:///{home / 'platform.db'}")
    return env


def mlflow_server_env(env: Mapping[str, str]) -> dict[str, str]:
    """The MLflow server's environment: not a client of itself, and without MLflow's job runner
    (huey consumers for its GenAI jobs, which the platform does not use: four more processes and
    about a minute of CPU per server start on a 2-core machine)."""
    server = {key: value for key, value in env.items() if key != "MLFLOW_TRACKING_URI"}
    server["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"
    return server


def new_state(
    home: Path, prefect_port: int, mlflow_port: int, store_uri: str, launch_pool: str
) -> StackState:
    return StackState(
        home=home,
        prefect_port=prefect_port,
        mlflow_port=mlflow_port,
        prefect_api_url=prefect_api_url(prefect_port),
        prefect_ui_url=prefect_ui_url(prefect_port),
        mlflow_url=mlflow_url(mlflow_port),
        mlflow_store_uri=store_uri,
        artifacts_dir=home / "mlartifacts",
        launch_pool=launch_pool,
        work_pools=list(dict.fromkeys([*STAGE_POOLS, launch_pool])),
    )


def stop_order(processes: Iterable[StackProcess]) -> list[list[StackProcess]]:
    """Workers first (they talk to the servers while they stop), then the servers."""
    processes = list(processes)
    return [[p for p in processes if p.role == "worker"], [p for p in processes if p.role != "worker"]]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    if not path.exists():
        return "(no log)"
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
