"""A real run tracked in a real MLflow store and the platform database (SQLite in a temporary home).

One short pipeline run (checkpoints and figures every 2 versions) is launched once for the module,
with the ``pipelinerl run`` command as a user launches it; the tests read back what MLflow and the
database hold and compare it with the run's own files (and what the command printed).
A second run, also once for the module, resumes from the first one's checkpoint and tracks to a real
MLflow server that goes away mid-run and comes back; that server then also takes replayed records.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipelinerl.launch.launcher import RunResult, launch
from pipelinerl.platform.checkpoint import read_info
from pipelinerl.platform.config import load_config
from pipelinerl.platform.jsonl import JsonlTail
from pipelinerl.platform.tracking.db import database_url
from pipelinerl.platform.tracking.liveness import start_ticks, this_process
from pipelinerl.platform.tracking.metric_registry import declaration
from pipelinerl.platform.tracking.mlflow_store import MlflowStore, mlflow_uri
from pipelinerl.platform.tracking.run_tracker import RunTracker
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.mlflow_reader import MlflowReader
from pipelinerl.ui.queries import PlatformReader, RunFilter
from pipelinerl.ui.service import Dashboard
from tests.conftest import free_port, wait_until, worker_port

# The module's runs are set up by their first tests (the second waits out a server outage): room for
# a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STEPS = 4


@pytest.fixture(scope="module")
def tracked_command(tmp_path_factory, random_model_dir):
    """The module's run, launched with the command: its config, run directory and the command's output."""
    tmp_path = tmp_path_factory.mktemp("tracked")
    settings = [
        f"model.path={random_model_dir}",
        f"run.output_dir={tmp_path / 'runs'}",
        f"run.home={tmp_path / 'home'}",
        f"run.max_steps={STEPS}",
        "run.name=tracking-test",
        "rl.group_size=4",
        "rl.batch_size=16",
        "actor.max_in_flight=16",
        "task.eval_problems=16",
        "trainer.checkpoint_every=2",
        "tracking.figures_every=2",
        "tracking.flush_interval_s=0.5",
        f"transport.base_port={worker_port(22100)}",
        "run.plan_profile=cpu-2core",  # the run predicted at its end, beside what it measured
    ]
    command = subprocess.run(
        [sys.executable, "-m", "pipelinerl.cli", "run", *[f"--set={setting}" for setting in settings]],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert command.returncode == 0, command.stdout[-3000:] + command.stderr[-3000:]
    (run_dir,) = list((tmp_path / "runs").iterdir())
    return load_config(None, settings), run_dir, command


@pytest.fixture(scope="module")
def tracked(tracked_command):
    config, run_dir, _ = tracked_command
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    result = RunResult(run_dir, json.loads((run_dir / "summary.json").read_text()), records)

    client = MlflowClient(tracking_uri=mlflow_uri(config))
    mlflow_run_id = (result.run_dir / "mlflow_run_id").read_text()
    return config, result, client, client.get_run(mlflow_run_id), database_url(config)


SUMMARY_FIELDS = {
    "mode", "steps", "final_policy_version", "eval_success_start", "eval_success_end", "eval_samples",
    "ess_mean", "lag_mean", "lag_max", "inflight_sequences", "wall_s", "tokens_per_s",
}  # fmt: skip


def test_the_command_writes_the_run_directory_and_says_what_it_did(tracked_command):
    _, run_dir, command = tracked_command
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_FIELDS
    assert summary["steps"] == summary["final_policy_version"] == STEPS and summary["eval_samples"] == 16
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in records] == list(range(1, STEPS + 1))
    assert json.loads((run_dir / "config.json").read_text())["run"]["max_steps"] == STEPS
    # the launcher's last phase, for the dashboard (platform/run_phase.py)
    assert (
        json.loads((run_dir / "phase.json").read_text())["text"]
        == "measuring held-out success of the final policy"
    )
    assert "held-out success" in command.stdout and "sequences written by 2+ versions" in command.stdout
    assert "MLflow run" in command.stdout
    assert (run_dir / "mlflow_run_id").read_text() in command.stdout.replace("\n", "")


def test_plan_calibrates_a_profile_on_the_run_and_predicts_it(tracked_command, tmp_path):
    """``pipelinerl plan calibrate`` on this real run's records, then ``pipelinerl plan`` with that
    profile on the run's own config: every figure the records hold is fitted (above 0), and the
    predicted run trains what the config asks."""
    config, run_dir, _ = tracked_command
    profile = tmp_path / "profile.json"
    command = [sys.executable, "-m", "pipelinerl.cli", "plan"]
    done = subprocess.run(
        [*command, "calibrate", str(run_dir), "--out", str(profile)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    figures = json.loads(profile.read_text())["figures"]
    value = {name: figure["value"] for name, figure in figures.items()}
    # How the fit splits a cost between its fixed and per-unit parts depends on the run (a part may
    # come out 0); what each fitted cost comes to on this run's own sizes may not.
    assert value["decode_base_s"] + value["decode_per_sequence_s"] * config.actor.max_in_flight > 0, value
    tokens = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])["trainer/tokens"]
    assert value["train_base_s"] + value["train_per_token_s"] * tokens > 0, value
    assert value["transfer_s"] > 0 and value["update_pause_s"] > 0, value
    for name in ("decode_base_s", "train_base_s", "transfer_s", "update_pause_s"):
        assert run_dir.name in figures[name]["source"]
    settings = [
        f"--set=run.max_steps={config.run.max_steps}",
        f"--set=rl.batch_size={config.rl.batch_size}",
        f"--set=actor.max_in_flight={config.actor.max_in_flight}",
    ]
    predicted = subprocess.run(
        [*command, "--profile", str(profile), "--lengths", f"run:{run_dir}", "--json", "--modes", "pipeline"]
        + settings,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert predicted.returncode == 0, predicted.stdout + predicted.stderr
    run = json.loads(predicted.stdout)["pipeline"]
    trained = config.run.max_steps * config.rl.batch_size
    assert run["samples_per_s"] > 0 and run["seconds"] > 0
    assert sum(run["lag_tokens"].values()) >= trained  # every trained sequence has a token or more


def test_the_run_is_predicted_beside_what_it_measured(tracked):
    """``run.plan_profile``: at the run's end the simulator predicts it (its config, its own completion
    lengths) and the launcher writes both to plan_prediction.json and MLflow's plan/... metrics."""
    config, result, client, run, _ = tracked
    prediction = json.loads((result.run_dir / "plan_prediction.json").read_text())
    assert prediction["profile"] == "cpu-2core" and prediction["mode"] == "pipeline"
    assert prediction["predicted"]["samples"] == STEPS * config.rl.batch_size
    seen = prediction["measured"]
    records = result.records
    span = records[-1]["time"] - records[0]["time"]
    assert seen["steady_samples_per_s"] == pytest.approx((STEPS - 1) * config.rl.batch_size / span)
    assert seen["lag_max"] == result.summary["lag_max"]
    assert seen["lag_mean"] == pytest.approx(result.summary["lag_mean"], abs=1e-9)
    logged = {
        key: metric.value
        for key in run.data.metrics
        if key.startswith("plan/")
        for metric in client.get_metric_history(run.info.run_id, key)
    }
    assert logged["plan/measured/steady_samples_per_s"] == pytest.approx(seen["steady_samples_per_s"])
    assert logged["plan/predicted/lag_mean"] == pytest.approx(prediction["predicted"]["lag_mean"])
    assert set(logged) == {f"plan/{side}/{name}" for side in ("predicted", "measured") for name in seen}
    assert "plan_prediction.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


def test_run_params_and_tags(tracked):
    config, result, client, run, _ = tracked
    assert run.info.status == "FINISHED"
    assert run.info.run_name == result.run_dir.name
    assert client.get_experiment(run.info.experiment_id).name == "tracking-test"
    params = run.data.params
    assert params["run.mode"] == "pipeline"
    assert params["rl.batch_size"] == "16"
    assert params["trainer.checkpoint_every"] == "2"
    assert len(params) >= 40, "the whole flattened config is logged"
    tags = run.data.tags
    assert tags["mode"] == "pipeline" and tags["task"] == "arithmetic"
    assert tags["model"] == str(config.model.path)
    assert len(tags["git_commit"]) == 40


def test_metrics_use_stable_names_and_policy_versions_as_steps(tracked):
    _, result, client, run, _ = tracked
    run_id = run.info.run_id
    for key in ("rl/loss", "rl/reward_mean", "rl/ess", "lag/mean", "lag/p50", "lag/p90", "lag/max"):
        history = client.get_metric_history(run_id, key)
        assert [m.step for m in history] == list(range(1, STEPS + 1)), key
        logged = [m.value for m in history]
        assert logged == pytest.approx([r[key] for r in result.records]), key
    samples = client.get_metric_history(run_id, "samples/trained")
    assert [m.value for m in samples] == [16, 32, 48, 64]
    for key in (
        "trainer/idle_fraction",
        "throughput/trainer_tokens_per_s",
        "weights/broadcast_ms",
        "weights/update_pause_ms",
        "throughput/actor_tokens_per_s",
        "actor/idle_fraction",
        "queue/rollouts",
    ):
        history = client.get_metric_history(run_id, key)
        assert history, f"{key} was never logged"
        assert declaration(key) is not None and declaration(key).mlflow
    idle = [m.value for m in client.get_metric_history(run_id, "trainer/idle_fraction")]
    assert all(0 <= value <= 1 for value in idle)
    evals = client.get_metric_history(run_id, "eval/success")
    assert [m.step for m in evals] == [0, STEPS]
    assert evals[-1].value == pytest.approx(result.summary["eval_success_end"])
    # Real timestamps: metrics of later versions were logged later.
    ess = client.get_metric_history(run_id, "rl/ess")
    assert [m.timestamp for m in ess] == sorted(m.timestamp for m in ess)
    assert client.get_metric_history(run_id, "ledger/duplicates")[-1].value == 0


def test_figures_and_summary_are_artifacts(tracked):
    _, result, client, run, _ = tracked
    names = {artifact.path for artifact in client.list_artifacts(run.info.run_id, "figures")}
    assert {
        "figures/lag_histogram.png",
        "figures/lag_by_position.png",
        "figures/learning_curves.png",
        "figures/ess_by_step.png",
    } <= names
    local = Path(client.download_artifacts(run.info.run_id, "summary.json"))
    assert json.loads(local.read_text())["steps"] == result.summary["steps"]


def test_checkpoints_are_logged_models_with_their_version(tracked):
    _, result, client, run, _ = tracked
    models = client.search_logged_models(experiment_ids=[run.info.experiment_id])
    by_version = {int(m.tags["policy_version"]): m for m in models if m.source_run_id == run.info.run_id}
    assert sorted(by_version) == [2, STEPS]
    middle = by_version[2]
    assert middle.tags["samples_trained"] == "32"
    checkpoint = Path(middle.tags["checkpoint"])
    assert checkpoint == result.run_dir / "checkpoints" / "v000002"
    assert read_info(checkpoint).policy_version == 2
    assert Path(by_version[STEPS].tags["checkpoint"]) == result.run_dir / "final"


def test_platform_database_holds_the_run(tracked):
    _, result, _, run, url = tracked

    store = PlatformStore(url)
    detail = store.get_run(result.run_dir.name)
    assert detail.run.status == "finished"
    assert detail.run.mode == "pipeline"
    assert detail.run.mlflow_run_id == run.info.run_id
    assert [s.version for s in detail.steps] == list(range(1, STEPS + 1))
    assert [s.ess for s in detail.steps] == pytest.approx([r["rl/ess"] for r in result.records])
    versions = {v.version: v for v in detail.policy_versions}
    assert versions[2].checkpoint_path == str(result.run_dir / "checkpoints" / "v000002")
    assert versions[STEPS].samples_trained == 64
    assert all(versions[v].broadcast_ms is not None for v in range(1, STEPS + 1))
    assert any(v.pause_ms is not None for v in versions.values()), "actor pauses reach the database"
    # Every trained rollout is in the ledger exactly once.
    assert len(store.consumed_ids(result.run_dir.name)) == result.summary["samples_trained"]
    assert sum(detail.lag_histograms[1].values()) == result.records[0]["trainer/tokens"]


def test_resume_from_a_checkpoint(served):
    """The served run resumed from the tracked run's checkpoint at version 2."""
    resumed = served.result
    assert [r["policy_version"] for r in resumed.records] == list(range(3, SERVED_STEPS + 1))
    assert resumed.records[0]["samples/trained"] == 32 + 16
    assert resumed.summary["start_policy_version"] == 2
    assert read_info(resumed.run_dir / "final").policy_version == SERVED_STEPS


def test_the_same_records_track_to_postgresql(tracked, postgres_url, second_postgres_url):
    """MLflow and the platform tables on a real PostgreSQL database, fed the run's own records."""
    config, result, _, _, _ = tracked
    on_postgres = config.model_copy(
        update={
            "tracking": config.tracking.model_copy(
                update={"mlflow_uri": postgres_url, "database_url": second_postgres_url}
            )
        }
    )
    tracker = RunTracker(on_postgres, "replayed-run")
    mlflow_run_id = tracker.start(config.model.path, started_at=time.time())
    tracker.trainer_records(JsonlTail(result.run_dir / "metrics.jsonl").read())
    tracker.actor_records(JsonlTail(result.run_dir / "actor0.jsonl").read())
    tracker.preprocessor_records(JsonlTail(result.run_dir / "preprocessor.jsonl").read())
    tracker.finish("finished", result.summary)

    client = MlflowClient(tracking_uri=postgres_url)
    history = client.get_metric_history(mlflow_run_id, "rl/ess")
    assert [m.value for m in history] == pytest.approx([r["rl/ess"] for r in result.records])
    assert client.get_run(mlflow_run_id).data.params["run.mode"] == "pipeline"
    detail = PlatformStore(second_postgres_url).get_run("replayed-run")
    assert detail.run.status == "finished" and len(detail.steps) == STEPS
    assert tracker.failures == 0


@contextlib.contextmanager
def mlflow_server(store: Path, port: int) -> Iterator[str]:
    """A real ``mlflow server`` on 127.0.0.1 with a SQLite store and served artifacts."""
    server = subprocess.Popen(
        [
            str(Path(sys.executable).parent / "mlflow"),
            "server",
            "--backend-store-uri",
            f"sqlite:///{store / 'server.db'}",
            "--artifacts-destination",
            str(store / "server-artifacts"),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--workers",
            "1",
        ],
        env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    uri = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        try:
            urllib.request.urlopen(f"{uri}/health", timeout=2)
        except OSError:
            return False
        return True

    try:
        wait_until(healthy, timeout_s=90, what="the mlflow server to become healthy", interval_s=0.5)
        yield uri
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(timeout=30)


def with_tracking(config, **update):
    return config.model_copy(update={"tracking": config.tracking.model_copy(update=update)})


class LogLines(logging.Handler):
    """What the run logged (all loggers reach the root), for a module-scoped fixture (no caplog)."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


SERVED_STEPS = 12  # resumed at 2: ten steps, the server down in the middle


@dataclass
class Served:
    uri: str  # the server, up again (on the same store) for the rest of the module
    store: Path  # its database and artifacts
    result: object  # RunResult of the run resumed from the tracked run's checkpoint
    logs: LogLines


@pytest.fixture(scope="module")
def served(tmp_path_factory, tracked) -> Iterator[Served]:
    """The tracked run resumed from its checkpoint at version 2, tracking to a real MLflow server
    that is stopped once it has two steps, and brought back on the same store once the run has
    found it unreachable (the outage is then part of the run, whatever the machine's speed)."""
    config, tracked_result, *_ = tracked
    tmp_path = tmp_path_factory.mktemp("served")
    port = free_port()
    resumed_config = config.model_copy(
        update={
            "run": config.run.model_copy(
                update={
                    "resume_from": tracked_result.run_dir / "checkpoints" / "v000002",
                    "output_dir": tmp_path / "runs",
                    "max_steps": SERVED_STEPS,
                }
            ),
            "transport": config.transport.model_copy(update={"base_port": worker_port(22200)}),
            "tracking": config.tracking.model_copy(
                update={
                    "mlflow_uri": f"http://127.0.0.1:{port}",
                    "database_url": f"sqlite:///{tmp_path / 'platform.db'}",
                    "final_flush_timeout_s": 120,
                }
            ),
        }
    )
    logs = LogLines()
    logging.getLogger().addHandler(logs)
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["result"] = launch(resumed_config, run_id="outage")
        except BaseException as error:
            outcome["error"] = error

    def alive() -> bool:
        if not thread.is_alive() and "result" not in outcome:
            pytest.fail(f"the run thread died: {outcome}")
        return True

    try:
        with mlflow_server(tmp_path, port):
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            metrics = tmp_path / "runs" / "outage" / "metrics.jsonl"
            wait_until(
                lambda: alive() and metrics.exists() and len(metrics.read_text().splitlines()) >= 2,
                timeout_s=240,
                what="the resumed run's first two steps",
                interval_s=0.2,
            )
        # The server is down now; training goes on.
        wait_until(
            lambda: alive() and "tracking store unreachable" in logs.text,
            timeout_s=120,
            what="the run to notice that the tracking server went away",
            interval_s=0.2,
        )
        with mlflow_server(tmp_path, port) as uri:
            thread.join(timeout=300)
            assert not thread.is_alive(), "the run did not end within 300 s of the server's return"
            if "error" in outcome:
                raise outcome["error"]
            yield Served(uri=uri, store=tmp_path, result=outcome["result"], logs=logs)
    finally:
        logging.getLogger().removeHandler(logs)


def test_a_tracking_server_that_goes_away_mid_run(served):
    """The run keeps training while the server is down, says so, and writes everything once it is back."""
    result = served.result
    assert result.summary["steps"] == SERVED_STEPS - 2
    assert "tracking store unreachable" in served.logs.text
    assert "reachable again" in served.logs.text
    client = MlflowClient(tracking_uri=served.uri)
    run = client.get_run((result.run_dir / "mlflow_run_id").read_text())
    assert run.info.status == "FINISHED"
    steps = [m.step for m in client.get_metric_history(run.info.run_id, "rl/ess")]
    assert steps == list(range(3, SERVED_STEPS + 1)), "every step reached MLflow exactly once"


def test_the_same_records_track_to_a_tracking_server(tracked, served, tmp_path):
    """``tracking.mlflow_uri=http://...``: records and figures reach a real server."""
    config, result, _, _, _ = tracked
    on_server = with_tracking(
        config, mlflow_uri=served.uri, database_url=f"sqlite:///{tmp_path / 'platform.db'}"
    )
    tracker = RunTracker(on_server, "served-run")
    mlflow_run_id = tracker.start(config.model.path, started_at=time.time())
    tracker.trainer_records(JsonlTail(result.run_dir / "metrics.jsonl").read())
    tracker.finish("finished", result.summary)
    client = MlflowClient(tracking_uri=served.uri)
    history = client.get_metric_history(mlflow_run_id, "lag/mean")
    assert [m.value for m in history] == pytest.approx([r["lag/mean"] for r in result.records])
    names = {a.path for a in client.list_artifacts(mlflow_run_id, "figures")}
    assert "figures/lag_histogram.png" in names
    stored = (served.store / "server-artifacts").rglob("lag_histogram.png")
    assert any(mlflow_run_id in path.parts for path in stored), "the server stored it"
    assert tracker.failures == 0


def test_a_run_whose_launcher_died_is_marked_crashed_and_caught_up_by_the_dashboard(tracked, tmp_path):
    """The stores hold one version of a run whose directory holds all; its launcher's process is gone.
    The dashboard's next runs listing marks it crashed, writes the rest and ends its MLflow run."""
    config, result, client, _, _ = tracked
    database = f"sqlite:///{tmp_path / 'platform.db'}"
    records = JsonlTail(result.run_dir / "metrics.jsonl").read()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    launcher = {**this_process(), "pid": dead.pid, "start_ticks": start_ticks(dead.pid)}
    dead.wait()
    mlflow = MlflowStore(mlflow_uri(config))
    mlflow_run_id = mlflow.start_run("catch-up-test", "died", {})
    with PlatformStore(database) as store:
        store.create_run(
            "died",
            name="catch-up-test",
            mode="pipeline",
            config=config.model_dump(mode="json"),
            started_at=datetime.now(UTC),
            mlflow_run_id=mlflow_run_id,
            run_dir=str(result.run_dir),
            launcher=launcher,
        )
        first = records[0]
        store.record_step("died", first["policy_version"], first, first["lag/histogram"])
    dashboard = Dashboard(PlatformReader(database), MlflowReader(mlflow_uri(config), None), None)
    listed = dashboard.runs(RunFilter())
    [row] = listed["runs"]
    assert row["status"] == "crashed"
    assert any("run died marked crashed" in warning for warning in listed["warnings"]), listed["warnings"]
    with PlatformStore(database) as store:
        assert store.recorded_versions("died") == {r["policy_version"] for r in records}
        assert store.consumed_ids("died") == {rollout for r in records[1:] for rollout, _ in r["rollouts"]}
    steps = {point.step for point in client.get_metric_history(mlflow_run_id, "rl/loss")}
    assert steps == {r["policy_version"] for r in records[1:]}
    assert client.get_run(mlflow_run_id).info.status == "FAILED"
