"""One metric registry, checked on a real run: every key the run wrote (each stage's records,
``summary.json``, MLflow) is declared for where it was written, the dashboard's API and MLflow give
the same trainer tokens/s and idle fraction at every step (both recomputed here from the trainer's own
``metrics.jsonl``), actors are a label of their MLflow names, and a run written before the renames
still shows on the dashboard.

One short pipeline run (two actors, held-out evaluation every two versions) is launched once for the
module, with MLflow and the platform database in SQLite files; the dashboard is the real app.
"""

from __future__ import annotations

import io
import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from mlflow.tracking import MlflowClient
from rich.console import Console

from pipelinerl.launch.launcher import RunResult, launch
from pipelinerl.launch.progress import ProgressView
from pipelinerl.platform.config import PipelineConfig, load_config
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.mlflow_store import MetricPoint, MlflowStore
from pipelinerl.platform.tracking.store import PlatformStore
from pipelinerl.ui.app import UiSettings, create_app, settings_from_config
from pipelinerl.ui.load_benchmark import fill_synthetic_run
from pipelinerl.ui.series import STAGE_WINDOW
from tests.conftest import worker_port

# The run (two actors, evaluations) takes a few minutes on a loaded CPU machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

STEPS = 6
NUM_ACTORS = 2


@dataclass(frozen=True)
class Tracked:
    config: PipelineConfig
    result: RunResult
    mlflow: Any  # MlflowClient
    mlflow_run_id: str
    api: TestClient

    def history(self, name: str) -> dict[int, float]:
        """The metric's MLflow history as step -> value (the last point of a step)."""
        points = sorted(self.mlflow.get_metric_history(self.mlflow_run_id, name), key=lambda m: m.timestamp)
        return {int(m.step): float(m.value) for m in points}

    def records(self, file_name: str) -> list[dict[str, Any]]:
        text = (self.result.run_dir / file_name).read_text()
        return [json.loads(line) for line in text.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def tracked(tmp_path_factory: pytest.TempPathFactory, random_model_dir: Path) -> Iterator[Tracked]:
    root = tmp_path_factory.mktemp("registry")
    config = load_config(
        None,
        [
            f"model.path={random_model_dir}",
            f"run.output_dir={root / 'runs'}",
            f"run.home={root / 'home'}",
            f"tracking.database_url=sqlite:///{root / 'platform.db'}",
            f"tracking.mlflow_uri=sqlite:///{root / 'mlflow.db'}",
            f"run.max_steps={STEPS}",
            "run.name=registry-test",
            "rl.group_size=4",
            "rl.batch_size=16",
            f"actor.num_actors={NUM_ACTORS}",
            "actor.max_in_flight=16",
            "task.eval_problems=8",
            "eval.every=2",
            "eval.samples=2",
            "trainer.checkpoint_every=3",
            "tracking.flush_interval_s=0.5",
            f"transport.base_port={worker_port(24500)}",
        ],
    )
    result = launch(config)
    settings = settings_from_config(config)
    with TestClient(create_app(settings)) as api:
        yield Tracked(
            config,
            result,
            MlflowClient(tracking_uri=settings.mlflow_uri),
            (result.run_dir / "mlflow_run_id").read_text(),
            api,
        )


def undeclared(keys: Any, record: registry.Record) -> list[str]:
    """The keys not declared as written into ``record``."""
    return sorted(
        key for key in keys if (metric := registry.declaration(key)) is None or record not in metric.records
    )


# ----- every key is declared -----


def test_every_key_of_every_stage_record_is_declared_for_that_record(tracked: Tracked) -> None:
    files: dict[str, registry.Record] = {
        "metrics.jsonl": "trainer",
        "preprocessor.jsonl": "preprocessor",
        "eval.jsonl": "eval",
        **{f"actor{k}.jsonl": "actor" for k in range(NUM_ACTORS)},
    }
    seen: set[str] = set()
    for file_name, kind in files.items():
        records = tracked.records(file_name)
        # The run ends at its last step without waiting for an eval round still in flight, and this
        # one trains its 6 steps in about a second: its eval rounds (due at v2, v4) may all be cut off.
        assert records or file_name == "eval.jsonl", f"{file_name} is empty"
        for record in records:
            assert undeclared(record, kind) == [], file_name
            seen.update(record)
    final = json.loads((tracked.result.run_dir / "preprocessor.final.json").read_text())
    assert undeclared(final, "preprocessor_final") == []
    old = set(registry.RECORD_ALIASES["trainer"])
    trainer_keys = {key for record in tracked.records("metrics.jsonl") for key in record}
    assert not trainer_keys & old, "the trainer writes no bare statistics any more"
    assert {registry.TRAINER_SAMPLES, registry.TRAINER_TOKENS, registry.COMPLETION_LEN_P90} <= trainer_keys


def test_every_field_of_summary_json_is_declared(tracked: Tracked) -> None:
    summary = json.loads((tracked.result.run_dir / "summary.json").read_text())
    assert undeclared((registry.summary_name(key) for key in summary), "summary") == []


def test_every_metric_in_mlflow_is_declared_as_one(tracked: Tracked) -> None:
    logged = tracked.mlflow.get_run(tracked.mlflow_run_id).data.metrics
    assert len(logged) > 40
    not_mlflow = [key for key in logged if not getattr(registry.declaration(key), "mlflow", False)]
    assert not_mlflow == []
    assert not [key for key in logged if registry.canonical_name(key) != key], "no old name is logged"


# ----- one definition of the trainer's statistics -----


def test_dashboard_and_mlflow_give_the_same_trainer_tokens_per_s_and_idle_fraction(tracked: Tracked) -> None:
    run_id = tracked.result.run_dir.name
    steps = tracked.api.get(f"/api/runs/{run_id}/steps").json()
    assert steps["version"] == list(range(1, STEPS + 1))
    trainer = {int(r[registry.POLICY_VERSION]): r for r in tracked.records("metrics.jsonl")}
    for name, column in (
        (registry.TRAINER_TOKENS_PER_S, "trainer_tokens_per_s"),
        (registry.TRAINER_IDLE_FRACTION, "trainer_idle_fraction"),
    ):
        logged = tracked.history(name)
        assert sorted(logged) == steps["version"], name
        from_file = {version: registry.derive(name, record) for version, record in trainer.items()}
        for version, shown in zip(steps["version"], steps[column], strict=True):
            assert shown == pytest.approx(logged[version], rel=1e-12), (name, version)
            assert logged[version] == pytest.approx(from_file[version], rel=1e-12), (name, version)
    # The broadcast counts: where weights went out, tokens/s is below tokens / (step + wait seconds).
    broadcast = [v for v, r in trainer.items() if r.get(registry.WEIGHTS_BROADCAST_MS)]
    assert broadcast, "the pipeline published weights after its steps"
    for version in broadcast:
        record = trainer[version]
        without = record[registry.TRAINER_TOKENS] / (
            record[registry.TRAINER_STEP_S] + record[registry.TRAINER_WAIT_S]
        )
        assert tracked.history(registry.TRAINER_TOKENS_PER_S)[version] < without
    runs = tracked.api.get("/api/runs").json()["runs"]
    [listed] = [run for run in runs if run["id"] == run_id]
    newest = tracked.history(registry.TRAINER_TOKENS_PER_S)[STEPS]
    assert listed["tokens_per_s"]["trainer"] == pytest.approx(newest, rel=1e-12), "the runs list's, too"


def test_the_trainer_stage_box_is_the_registry_over_its_window(tracked: Tracked) -> None:
    box = tracked.api.get(f"/api/runs/{tracked.result.run_dir.name}/live").json()["stages"]["trainer"]
    window = tracked.records("metrics.jsonl")[-STAGE_WINDOW:]
    expected_tokens_per_s = registry.derive_over(registry.TRAINER_TOKENS_PER_S, window)
    expected_idle = registry.derive_over(registry.TRAINER_IDLE_FRACTION, window)
    assert expected_tokens_per_s is not None and expected_idle is not None
    assert box["tokens_per_s"] == pytest.approx(expected_tokens_per_s, abs=1e-3)
    assert box["idle_fraction"] == pytest.approx(expected_idle, abs=1e-4)
    assert box["units"] == {"tokens_per_s": "tokens/s", "idle_fraction": "fraction"}


def test_summary_and_terminal_show_the_same_trainer_statistics(tracked: Tracked) -> None:
    records = tracked.records("metrics.jsonl")
    summary = tracked.result.summary
    over_run = registry.derive_over(registry.TRAINER_TOKENS_PER_S, records)
    assert summary[registry.S_TOKENS_PER_S] == pytest.approx(over_run, rel=1e-12)
    idle_over_run = registry.derive_over(registry.TRAINER_IDLE_FRACTION, records)
    assert summary[registry.S_TRAINER_WAIT_FRACTION] == pytest.approx(idle_over_run, rel=1e-12)
    logged = tracked.history(registry.summary_name(registry.S_TOKENS_PER_S))
    assert logged[0] == pytest.approx(summary[registry.S_TOKENS_PER_S], rel=1e-12)
    console = Console(file=io.StringIO(), width=200, record=True)
    with ProgressView(console, tracked.config) as view:
        view.add_records(records)
    [row] = [line.split() for line in console.export_text().splitlines() if line.split()[:1] == [str(STEPS)]]
    assert f"{tracked.history(registry.TRAINER_TOKENS_PER_S)[STEPS]:.0f}" in row, "the step's, as in MLflow"


# ----- actors are a label -----


def test_each_actor_has_its_own_names_and_the_plain_names_are_all_actors(tracked: Tracked) -> None:
    logged = tracked.mlflow.get_run(tracked.mlflow_run_id).data.metrics
    assert not [key for key in logged if ":" in key], "no actor<k>: prefix"
    plain = registry.ACTOR_TOKENS_PER_S
    per_actor = []
    for actor_id in range(NUM_ACTORS):
        name = registry.per_actor_name(plain, actor_id)
        assert registry.actor_label(name) == (actor_id, plain)
        records = tracked.records(f"actor{actor_id}.jsonl")
        values = sorted(r[plain] for r in records)
        assert sorted(tracked.history(name).values()) == pytest.approx(
            sorted({int(r[registry.POLICY_VERSION]): r[plain] for r in records}.values())
        ), "actor k's own series is actor k's records"
        per_actor.append([0.0, *values])
    # Each point of the plain name is the actors' latest rates added up (an actor not reported yet: 0).
    sums = [sum(pair) for pair in itertools.product(*per_actor)]
    for value in tracked.history(plain).values():
        assert min(abs(value - total) for total in sums) < 1e-6 * max(1.0, value), value
    live = tracked.api.get(f"/api/runs/{tracked.result.run_dir.name}/live").json()
    by_actor = live["stages"]["actor"]["by_actor"]
    assert [a["actor_id"] for a in by_actor] == list(range(NUM_ACTORS))
    assert live["stages"]["actor"]["tokens_per_s"] == pytest.approx(logged[plain])


# ----- a run written before the renames -----


def test_a_run_written_before_the_renames_still_shows(tmp_path: Path) -> None:
    """A synthetic finished run whose MLflow history and trainer records carry the old names (actor 1
    as ``actor1:...``, ``completion_len_p90``, ``inflight_sequences``): the dashboard reads them under
    the new ones."""
    run = fill_synthetic_run(tmp_path, 12, "20261101-000000-pipeline-old001")
    assert run.mlflow_uri is not None
    with PlatformStore(run.database_url) as store:
        mlflow_run_id = store.get_run(run.run_id).run.mlflow_run_id
    assert mlflow_run_id is not None
    old_points = [
        MetricPoint("actor1:throughput/actor_tokens_per_s", 250.0 + step, step, 1.8e9 + step)
        for step in range(1, 13)
    ] + [MetricPoint("completion_len_p90", 40.0, 12, 1.8e9 + 12)]
    MlflowStore(run.mlflow_uri).log_metrics(mlflow_run_id, old_points)
    metrics = run.run_dir / "metrics.jsonl"
    old_lines = [
        json.dumps(registry_old_record(json.loads(line))) for line in metrics.read_text().splitlines()
    ]
    metrics.write_text("\n".join(old_lines) + "\n")
    with TestClient(create_app(UiSettings(database_url=run.database_url, mlflow_uri=run.mlflow_uri))) as api:
        live = api.get(f"/api/runs/{run.run_id}/live").json()
    assert live["warnings"] == []
    assert {"actor_id": 1, "tokens_per_s": 262.0} in live["stages"]["actor"]["by_actor"]
    assert len(live["multi_version_sequences"]) == 12, "inflight_sequences read as trainer/inflight_sequences"


def registry_old_record(record: dict[str, Any]) -> dict[str, Any]:
    """A trainer record as it was written before the renames."""
    old_of = {new: old for old, new in registry.RECORD_ALIASES["trainer"].items()}
    return {old_of.get(key, key): value for key, value in record.items()}
