"""``make compose-check``: the compose stack built and run for real, as a user brings it up.

1. A Docker daemon: the one that answers, or one started here (``scripts/docker-daemon.sh``: its state in
   a temporary directory, stopped and removed afterwards).
2. The base images from reachable sources (``scripts/compose-base.sh``: Debian's packages, the machine's
   torch wheel) where the official ones cannot be pulled; ``--official-images`` uses those instead.
3. ``docker compose build`` and ``up -d`` of the CPU services (the GPU workers are behind the ``gpu``
   profile), then every health check turning healthy and the migrations completing.
4. ``pipelinerl deploy`` in the launch worker's container, and an ``rl-run`` flow run through the
   Prefect API the stack publishes, which the stack's launch worker executes: the embedded default.
5. The run finished and learned (held-out success rose), MLflow (its published port) has the run with
   its metrics, the dashboard (its published port) lists it finished.
6. ``docker compose down -v`` leaves no container, network or volume of the project behind.

Prints each phase's time and, at the end, one JSON line with the times and the image sizes (the
figures of docs/benchmarks.md). Exit status 0 only if every check passed. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CPU_IMAGES = ("pipelinerl/platform:dev",)
PLATFORM_SERVICE = "prefect-server"
# What `docker compose up` starts without the gpu profile (docker-compose 1.29 lists every service in
# `config --services` and `ps --services`, profiles or not, so the check names them).
CPU_SERVICES = {
    "postgres",
    "prefect-server",
    "mlflow-server",
    "db-migrate",
    "dashboard",
    "launch-worker",
}  # one of the services built from docker/Dockerfile
PUBLISHED = {"prefect": 4200, "mlflow": 5000, "dashboard": 8300}
POSTGRES_PORT = 15432  # beside a PostgreSQL the machine may run on 5432
HEALTH_TIMEOUT_S = 900.0
RUN_TIMEOUT_S = 3600.0


class CheckFailed(RuntimeError):
    """A check of the stack failed; the message says which and what was seen."""


def log(message: str) -> None:
    print(f"[compose-check {time.strftime('%H:%M:%S')}] {message}", flush=True)


class Phases:
    """Wall time per phase, for the report."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        log(f"{name} ...")
        started = time.monotonic()
        try:
            yield
        finally:
            self.seconds[name] = round(time.monotonic() - started, 1)
            log(f"{name}: {self.seconds[name]:.0f} s")


def run(command: list[str], env: dict[str, str], timeout_s: float = 3600.0, quiet: bool = False) -> str:
    """``command``'s standard output; raises naming the command and its last output lines on failure."""
    done = subprocess.run(
        command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-25:])
        raise CheckFailed(f"`{' '.join(command)}` exited with {done.returncode}:\n{tail}")
    if not quiet and done.stderr.strip():
        print(done.stderr.strip()[-2000:], file=sys.stderr)
    return done.stdout


def http_json(url: str, body: dict[str, Any] | None = None, timeout_s: float = 30.0) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout_s) as response:
        return json.loads(response.read() or b"null")


def compose_cli() -> list[str]:
    """``docker compose`` where the plugin answers, else Debian's ``docker-compose``."""
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    if probe.returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    raise CheckFailed(
        "no compose implementation: install docker-compose (Debian) or the docker compose plugin"
    )


def ports_free() -> None:
    taken = []
    for name, port in {**PUBLISHED, "postgres": POSTGRES_PORT}.items():
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(f"{name} {port}")
    if taken:
        raise CheckFailed(f"ports the stack publishes are taken on 127.0.0.1: {', '.join(taken)}")


def wait_healthy(env: dict[str, str], project: str) -> None:
    """The project's containers are those of CPU_SERVICES exactly (no GPU worker: its profile is off),
    every one with a health check healthy and the one-shot migrations exited 0."""
    deadline = time.monotonic() + HEALTH_TIMEOUT_S
    while True:
        listed = run(
            [
                "docker",
                "ps",
                "-a",
                "--filter",
                f"label=com.docker.compose.project={project}",
                "--format",
                '{{.Label "com.docker.compose.service"}} {{.ID}}',
            ],
            env,
            quiet=True,
        ).split("\n")
        containers = dict(line.split() for line in listed if line.strip())
        if set(containers) - CPU_SERVICES:
            raise CheckFailed(
                f"`up` started services outside the CPU set: {sorted(set(containers) - CPU_SERVICES)}"
            )
        states = {service: "absent" for service in CPU_SERVICES}
        for service, container in containers.items():
            inspected = json.loads(run(["docker", "inspect", container], env, quiet=True))[0]["State"]
            health = (inspected.get("Health") or {}).get("Status")
            if health is not None:
                states[service] = health
            elif inspected["Status"] == "exited":
                code = inspected["ExitCode"]
                states[service] = "completed" if code == 0 else f"exited {code}"
            else:
                states[service] = inspected["Status"]
        failed = {s: v for s, v in states.items() if v == "unhealthy" or v.startswith("exited")}
        if failed:
            raise CheckFailed(f"services failed: {failed}")
        if all(v in ("healthy", "completed") for v in states.values()):
            log(f"healthy: {', '.join(sorted(states))}")
            return
        if time.monotonic() > deadline:
            raise CheckFailed(f"not healthy after {HEALTH_TIMEOUT_S:.0f} s: {states}")
        time.sleep(3.0)


def launch_run(prefect_api: str, parameters: dict[str, Any]) -> str:
    deployment = http_json(f"{prefect_api}/deployments/name/rl-run/default")
    created = http_json(
        f"{prefect_api}/deployments/{deployment['id']}/create_flow_run", {"parameters": parameters}
    )
    return str(created["id"])


def wait_for_flow_run(prefect_api: str, flow_run_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + RUN_TIMEOUT_S
    last = ""
    while time.monotonic() < deadline:
        flow_run = http_json(f"{prefect_api}/flow_runs/{flow_run_id}")
        state = flow_run["state"]["type"]
        if state != last:
            log(f"flow run {flow_run['name']}: {state}")
            last = state
        if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
            return dict(flow_run)
        time.sleep(5.0)
    raise CheckFailed(f"the rl-run flow run did not end within {RUN_TIMEOUT_S:.0f} s")


def check_run(compose: list[str], env: dict[str, str], flow_run: dict[str, Any]) -> dict[str, Any]:
    """The run's summary from the runs volume; what MLflow and the dashboard show of it."""
    if flow_run["state"]["type"] != "COMPLETED":
        raise CheckFailed(f"the run ended {flow_run['state']['type']}: {flow_run['state'].get('message')}")
    newest = run(
        [*compose, "exec", "-T", "launch-worker", "sh", "-c", "ls -t /app/runs | head -n 1"], env
    ).strip()
    summary = json.loads(
        run([*compose, "exec", "-T", "launch-worker", "cat", f"/app/runs/{newest}/summary.json"], env)
    )
    start, end = summary["eval_success_start"], summary["eval_success_end"]
    log(f"run {newest}: held-out success {start:.3f} -> {end:.3f}, {summary['steps']} steps")
    if not end > start:
        raise CheckFailed(f"the run did not learn: held-out success {start} -> {end}")
    mlflow = f"http://127.0.0.1:{PUBLISHED['mlflow']}"
    experiments = http_json(f"{mlflow}/api/2.0/mlflow/experiments/search", {"max_results": 100})[
        "experiments"
    ]
    found = http_json(
        f"{mlflow}/api/2.0/mlflow/runs/search",
        {"experiment_ids": [e["experiment_id"] for e in experiments], "max_results": 100},
    ).get("runs", [])
    mine = [r for r in found if r["info"].get("run_name") == newest or newest in json.dumps(r["data"])]
    if not mine or not mine[0]["data"].get("metrics"):
        raise CheckFailed(f"MLflow at {mlflow} has no run {newest} with metrics ({len(found)} runs)")
    listed = http_json(f"http://127.0.0.1:{PUBLISHED['dashboard']}/api/runs")["runs"]
    shown = next((r for r in listed if r["id"] == newest), None)
    if shown is None or shown.get("status") != "finished":
        raise CheckFailed(f"the dashboard does not list {newest} as finished: {shown}")
    return {"run_id": newest, "eval_success_start": start, "eval_success_end": end, "steps": summary["steps"]}


def leftovers(env: dict[str, str], project: str) -> dict[str, list[str]]:
    label = f"label=com.docker.compose.project={project}"
    return {
        kind: run(["docker", *command, "--filter", label, "-q"], env, quiet=True).split()
        for kind, command in {
            "containers": ["ps", "-a"],
            "networks": ["network", "ls"],
            "volumes": ["volume", "ls"],
        }.items()
    }


def image_sizes(env: dict[str, str], images: list[str]) -> dict[str, float]:
    sizes = {}
    for image in images:
        with contextlib.suppress(CheckFailed):
            size = json.loads(run(["docker", "image", "inspect", image], env, quiet=True))[0]["Size"]
            sizes[image] = round(size / 2**30, 2)
    return sizes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--official-images", action="store_true", help="pull python:3.11-slim and postgres:15"
    )
    parser.add_argument("--keep-daemon", action="store_true", help="leave a daemon started here running")
    parser.add_argument(
        "--config", default="{}", help="rl-run config overrides as JSON (default: the embedded default)"
    )
    args = parser.parse_args()

    phases = Phases()
    state = Path(tempfile.mkdtemp(prefix="pipelinerl-compose-"))
    project = f"pipelinerl-check-{os.getpid()}"
    # ACTOR_GPUS/TRAINER_GPUS: docker-compose 1.29 reads a GPU count interpolated from a variable as
    # text and refuses the whole file unless it is "all"; the GPU services are not started here anyway.
    env = dict(
        os.environ,
        COMPOSE_PROJECT_NAME=project,
        POSTGRES_PORT=str(POSTGRES_PORT),
        ACTOR_GPUS=os.environ.get("ACTOR_GPUS", "all"),
        TRAINER_GPUS=os.environ.get("TRAINER_GPUS", "all"),
    )
    report: dict[str, Any] = {"project": project}
    started_daemon = False
    compose: list[str] = []
    ok = False
    try:
        ports_free()
        with phases("daemon"):
            host = run(["bash", "scripts/docker-daemon.sh", "start", str(state)], env).strip()
            started_daemon = host.endswith(f"{state}/docker.sock")
            env["DOCKER_HOST"] = host
            compose = [*compose_cli(), "-f", "docker-compose.yml"]
        if not args.official_images:
            with phases("base images"):
                settings = run(["bash", "scripts/compose-base.sh"], env).strip().splitlines()[-1]
                for item in settings.split():
                    key, value = item.split("=", 1)
                    env[key] = value
        with phases("build"):
            # The CPU services share one image (pipelinerl/platform); building it once for each of them
            # is all cache hits, but a couple of minutes each on the vfs storage driver.
            run([*compose, "build", PLATFORM_SERVICE], env)
        with phases("up"):
            run([*compose, "up", "-d", "--no-build"], env)
            wait_healthy(env, project)
        with phases("deploy"):
            run([*compose, "exec", "-T", "launch-worker", "pipelinerl", "deploy"], env)
        prefect_api = f"http://127.0.0.1:{PUBLISHED['prefect']}/api"
        with phases("run"):
            flow_run_id = launch_run(prefect_api, {"config": json.loads(args.config)})
            flow_run = wait_for_flow_run(prefect_api, flow_run_id)
        report["run"] = check_run(compose, env, flow_run)
        report["images_gib"] = image_sizes(
            env, [*CPU_IMAGES, env.get("PYTHON_IMAGE", ""), env.get("POSTGRES_IMAGE", "")]
        )
        ok = True
    except (CheckFailed, urllib.error.URLError, subprocess.TimeoutExpired, KeyError) as error:
        log(f"FAILED: {type(error).__name__}: {error}")
    finally:
        if compose and "DOCKER_HOST" in env:
            with phases("down"):
                try:
                    run([*compose, "down", "-v", "--remove-orphans"], env, timeout_s=600)
                    left = {kind: ids for kind, ids in leftovers(env, project).items() if ids}
                except CheckFailed as error:
                    left, ok = {"down": [str(error)]}, False
            report["left_behind"] = left
            if left:
                log(f"FAILED: `down -v` left {left}")
                ok = False
        if started_daemon and not args.keep_daemon:
            subprocess.run(["bash", "scripts/docker-daemon.sh", "stop", str(state)], cwd=ROOT, check=False)
        if not args.keep_daemon:
            shutil.rmtree(state, ignore_errors=True)
    report["seconds"] = phases.seconds
    report["passed"] = ok
    log("passed" if ok else "failed")
    print(json.dumps(report))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
