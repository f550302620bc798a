"""Models and datasets named by Hugging Face Hub id: the resolver against an offline Hub cache written
on disk (tests/hub_cache.py), the config's checks, the launcher's one resolution before any stage, and
what the run records (config.json fields, MLflow tags). Nothing here reaches the network: every test
runs with HF_HUB_OFFLINE=1 and a temporary HF_HUB_CACHE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelinerl.launch.hub_sources import resolve_hub_sources
from pipelinerl.launch.model_source import resolve_model
from pipelinerl.launch.preflight import preflight
from pipelinerl.platform.config import ConfigError, load_config
from pipelinerl.platform.hub import fetch_command, hub_id_problem, is_hub_id, resolve_snapshot
from pipelinerl.platform.tracking.mlflow_store import run_tags
from pipelinerl.tasks.math_sources import FieldMap, load_splits
from tests.hub_cache import add_to_cache, fake_commit, gsm8k_settings, write_math_repo

MODEL_ID = "tiny-org/tiny-model"
DATASET_ID = "tiny-org/tiny-math"


@pytest.fixture
def hub_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    cache = tmp_path / "hf-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.fixture
def fake_model(tmp_path: Path) -> Path:
    source = tmp_path / "model-src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    return source


# ----- the resolver -----


def test_a_cached_id_resolves_to_its_snapshot_and_commit(hub_cache: Path, fake_model: Path) -> None:
    snapshot_dir = add_to_cache(hub_cache, MODEL_ID, fake_model)
    snapshot = resolve_snapshot(MODEL_ID)
    assert snapshot.path == snapshot_dir
    assert snapshot.commit == snapshot_dir.name == fake_commit(f"model:{MODEL_ID}:{fake_model}")
    assert snapshot.revision is None
    assert (snapshot.path / "config.json").is_file()


def test_a_revision_may_be_a_ref_or_a_commit(hub_cache: Path, fake_model: Path) -> None:
    old = add_to_cache(hub_cache, MODEL_ID, fake_model, refs=("v1",), commit="a" * 40)
    new = add_to_cache(hub_cache, MODEL_ID, fake_model, refs=("main",), commit="b" * 40)
    assert resolve_snapshot(MODEL_ID).path == new
    assert resolve_snapshot(MODEL_ID, revision="v1").commit == "a" * 40
    by_commit = resolve_snapshot(MODEL_ID, revision="a" * 40)
    assert (by_commit.path, by_commit.commit, by_commit.revision) == (old, "a" * 40, "a" * 40)


def test_a_missing_id_fails_naming_it_its_revision_and_the_fetch_command(hub_cache: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        resolve_snapshot("nobody/absent", revision="v2")
    message = str(caught.value)
    assert "\n" not in message
    assert "nobody/absent" in message and "'v2'" in message and "HF_HUB_OFFLINE" in message
    assert "hf download nobody/absent --revision v2" in message
    assert str(hub_cache) in message


def test_a_missing_ref_of_a_cached_id_fails_too(hub_cache: Path, fake_model: Path) -> None:
    add_to_cache(hub_cache, MODEL_ID, fake_model)
    with pytest.raises(ConfigError, match=r"hf download tiny-org/tiny-model --revision nope"):
        resolve_snapshot(MODEL_ID, revision="nope")


def test_the_fetch_command_names_a_dataset_and_a_cache_dir() -> None:
    assert fetch_command("openai/gsm8k", None, "dataset", Path("/shared/hf")) == (
        "hf download openai/gsm8k --repo-type dataset --cache-dir /shared/hf"
    )


@pytest.mark.parametrize(
    "bad", ["Qwen/Qwen 2.5", "Qwen/x@main", "Qwen/-x", "org--x/name", "a/b.git", "q/" + "x" * 99]
)
def test_malformed_ids_are_refused(bad: str) -> None:
    assert hub_id_problem(bad) is not None and not is_hub_id(bad)
    with pytest.raises(ConfigError, match="not a valid Hugging Face Hub id"):
        resolve_snapshot(bad)


def test_wellformed_ids() -> None:
    for good in ("Qwen/Qwen2.5-0.5B-Instruct", "openai/gsm8k", "meta-llama/Llama-3.1-8B", "a_b/c.d"):
        assert is_hub_id(good), good


# ----- the config -----


def test_model_path_takes_an_id_a_revision_and_a_cache_dir(tmp_path: Path) -> None:
    config = load_config(
        None, ["model.path=Qwen/Qwen2.5-0.5B-Instruct", "model.revision=v1", f"model.cache_dir={tmp_path}"]
    )
    assert config.model.is_hub_id() and str(config.model.path) == "Qwen/Qwen2.5-0.5B-Instruct"
    assert config.model.revision == "v1" and config.model.cache_dir == tmp_path


def test_a_missing_local_directory_keeps_its_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="model directory .*does not exist"):
        load_config(None, [f"model.path={tmp_path / 'nope'}"])
    with pytest.raises(ConfigError, match="model directory 'models' does not exist"):
        load_config(None, ["model.path=models"])


def test_a_malformed_id_is_refused_by_the_config() -> None:
    with pytest.raises(ConfigError, match="not a valid Hugging Face Hub id.*'@'"):
        load_config(None, ["model.path=Qwen/Qwen2.5@main"])


def test_a_revision_needs_an_id(tmp_path: Path, fake_model: Path) -> None:
    with pytest.raises(ConfigError, match="model.revision='v1' needs a Hugging Face Hub id.*local directory"):
        load_config(None, [f"model.path={fake_model}", "model.revision=v1"])
    with pytest.raises(ConfigError, match="model.revision='v1' needs a Hugging Face Hub id.*embedded"):
        load_config(None, ["model.revision=v1"])


# ----- the launcher -----


def test_the_launcher_resolves_the_model_once_and_records_the_id(
    hub_cache: Path, tmp_path: Path, fake_model: Path
) -> None:
    snapshot_dir = add_to_cache(hub_cache, MODEL_ID, fake_model, refs=("main", "v1"))
    config = load_config(None, [f"model.path={MODEL_ID}", "model.revision=v1"])
    resolved = resolve_hub_sources(config)
    assert resolved.model.path == snapshot_dir and not resolved.model.is_hub_id()
    assert resolved.model.revision is None  # the snapshot is a local directory: no revision applies
    snapshot = resolved.model.hub_snapshot
    assert snapshot is not None
    assert (snapshot.id, snapshot.revision, snapshot.commit) == (MODEL_ID, "v1", snapshot_dir.name)
    assert resolve_model(config) == snapshot_dir
    # what the run directory's config.json carries: the snapshot for loading, the id beside it
    written = json.loads(resolved.model_dump_json())
    assert written["model"]["path"] == str(snapshot_dir)
    assert written["model"]["hub_snapshot"] == {"id": MODEL_ID, "revision": "v1", "commit": snapshot_dir.name}
    tags = run_tags(resolved, snapshot_dir, None)
    assert tags["model.hub_id"] == MODEL_ID and tags["model.revision"] == "v1"
    assert tags["model.commit"] == snapshot_dir.name and tags["model"] == str(snapshot_dir)


def test_model_cache_dir_is_where_the_snapshot_is_looked_for(
    hub_cache: Path, tmp_path: Path, fake_model: Path
) -> None:
    shared = tmp_path / "shared-cache"
    snapshot_dir = add_to_cache(shared, MODEL_ID, fake_model)
    config = load_config(None, [f"model.path={MODEL_ID}", f"model.cache_dir={shared}"])
    assert resolve_hub_sources(config).model.path == snapshot_dir
    with pytest.raises(ConfigError, match=f"--cache-dir {hub_cache}"):  # not in the other cache
        resolve_hub_sources(load_config(None, [f"model.path={MODEL_ID}", f"model.cache_dir={hub_cache}"]))


def test_preflight_fails_on_a_missing_id_before_anything_starts(hub_cache: Path, tmp_path: Path) -> None:
    config = load_config(
        None,
        [
            "model.path=nobody/absent",
            "tracking.enabled=false",
            f"run.output_dir={tmp_path / 'runs'}",
            f"run.home={tmp_path / 'home'}",
        ],
    )
    with pytest.raises(ConfigError, match="nobody/absent.*hf download nobody/absent"):
        preflight(config)
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())  # no run directory


def test_preflight_returns_the_resolved_config(
    hub_cache: Path, tmp_path: Path, random_model_dir: Path
) -> None:
    snapshot_dir = add_to_cache(hub_cache, MODEL_ID, random_model_dir)
    config = load_config(
        None,
        [
            f"model.path={MODEL_ID}",
            "tracking.enabled=false",
            f"run.output_dir={tmp_path / 'runs'}",
            f"run.home={tmp_path / 'home'}",
        ],
    )
    assert preflight(config).model.path == snapshot_dir


# ----- the math task's dataset -----


def test_a_hub_dataset_resolves_and_reads_its_subset(hub_cache: Path, tmp_path: Path) -> None:
    repo = write_math_repo(tmp_path / "repo", subsets=("main", "socratic"))
    snapshot_dir = add_to_cache(hub_cache, DATASET_ID, repo, repo_type="dataset")
    config = load_config(None, gsm8k_settings(DATASET_ID))
    resolved = resolve_hub_sources(config)
    assert resolved.task.options["dataset"] == str(snapshot_dir)
    assert resolved.task.hub_snapshot is not None
    assert (resolved.task.hub_snapshot.id, resolved.task.hub_snapshot.commit) == (
        DATASET_ID,
        snapshot_dir.name,
    )
    assert run_tags(resolved, Path("m"), None)["dataset.hub_id"] == DATASET_ID
    fields = FieldMap("question", "answer", None, "gsm8k")
    splits = load_splits(str(snapshot_dir), fields, 0.1, subset="main")
    assert len(splits["train"]) == 12 and len(splits["eval"]) == 4
    assert splits["eval"][0].answer == "0" and splits["train"][0].question.startswith("main train")
    with pytest.raises(ValueError, match="several subsets.*dataset_subset"):
        load_splits(str(snapshot_dir), fields, 0.1)
    with pytest.raises(ValueError, match="no subset 'nope'; found: main, socratic"):
        load_splits(str(snapshot_dir), fields, 0.1, subset="nope")
    # a Hub id given to the task itself (outside the launcher) resolves through the same cache
    assert len(load_splits(DATASET_ID, fields, 0.1, subset="socratic")["train"]) == 12


def test_a_missing_hub_dataset_and_a_revision_with_a_local_dataset(hub_cache: Path, tmp_path: Path) -> None:
    fields = FieldMap("question", "answer", None, "gsm8k")
    with pytest.raises(ValueError, match="hf download nobody/data --repo-type dataset --revision r1"):
        load_splits("nobody/data", fields, 0.1, revision="r1")
    with pytest.raises(ValueError, match="dataset_revision='r1' needs a Hugging Face Hub id"):
        load_splits("shipped", fields, 0.1, revision="r1")
    with pytest.raises(ValueError, match="no such file or directory"):  # a file name is never an id
        load_splits("data/train.jsonl", fields, 0.1)


def test_an_eval_sets_hub_dataset_is_resolved_and_recorded(hub_cache: Path, tmp_path: Path) -> None:
    repo = write_math_repo(tmp_path / "repo")
    first = add_to_cache(hub_cache, DATASET_ID, repo, repo_type="dataset", refs=("main",), commit="d" * 40)
    second = add_to_cache(hub_cache, DATASET_ID, repo, repo_type="dataset", refs=("v2",), commit="e" * 40)
    config = load_config(
        None,
        [
            *gsm8k_settings(DATASET_ID),
            "eval.every=1",
            f'eval.sets={{later = {{dataset = "{DATASET_ID}", dataset_revision = "v2"}}, '
            "again = {eval_fraction = 0.5}}",
        ],
    )
    resolved = resolve_hub_sources(config)
    assert resolved.task.options["dataset"] == str(first)
    assert resolved.eval.sets["later"] == {"dataset": str(second)}
    assert resolved.eval.sets["again"] == {"eval_fraction": 0.5}  # inherits the task's resolved dataset
    recorded = resolved.eval.hub_snapshots["later"]
    assert (recorded.id, recorded.revision, recorded.commit) == (DATASET_ID, "v2", "e" * 40)
    assert set(resolved.eval.hub_snapshots) == {"later"}
