"""Replay bundles (``platform/bundles.py``): a run's replayable records in a directory that moves to
another machine, refused when incomplete, altered, of another format, or given the wrong model."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from pipelinerl.launch.replay import ReplayError, plan_replay
from pipelinerl.platform.bundles import BUNDLE_FILE, BundleError, export_bundle, model_digest, verify_bundle
from pipelinerl.platform.checkpoint import read_start
from tests.unit.launch.test_replay import write_run


def exported(tmp_path: Path, **options: object) -> tuple[Path, Path]:
    run_dir = write_run(tmp_path / "machine-a" / "run", ranks=2, checkpoints=(3,))
    bundle = tmp_path / "machine-a" / "bundle"
    export_bundle(run_dir, bundle, ranks=2, **options)  # type: ignore[arg-type]
    moved = tmp_path / "machine-b" / "bundle"
    moved.parent.mkdir()
    shutil.move(bundle, moved)
    return run_dir, moved


def test_a_bundle_holds_the_steps_from_its_checkpoint_with_relative_paths_only(tmp_path: Path) -> None:
    run_dir, bundle = exported(tmp_path, first=4)
    manifest = verify_bundle(bundle)
    assert (manifest.first, manifest.last, manifest.model_included) == (3, 6, False)
    assert manifest.model_digest == model_digest(tmp_path / "machine-a" / "start-model")
    assert "checkpoints/v000003/config.json" in manifest.files
    assert "batches/step_000004_rank1.batch" in manifest.files
    assert "batches/step_000003_rank0.batch" not in manifest.files  # before its checkpoint: not needed
    for path in bundle.rglob("*"):
        if path.is_file():
            assert str(tmp_path / "machine-a") not in path.read_bytes().decode(errors="replace"), path
    assert read_start(bundle).model_path == Path("model")
    plan = plan_replay(bundle, 4, None, [])  # from its checkpoint: the starting model is not needed
    assert (plan.first, plan.last, plan.model_path) == (3, 6, bundle / "checkpoints" / "v000003")
    with pytest.raises(ReplayError, match="the bundle holds versions 4..6"):
        plan_replay(bundle, 1, None, [])
    with pytest.raises(ReplayError, match="name a local copy with --model"):
        plan_replay(bundle, 4, None, ["rl.kl.coef=0.1"])  # the KL term's reference is the start


def test_the_starting_model_is_checked_by_its_digest(tmp_path: Path) -> None:
    _, bundle = exported(tmp_path)
    start_model = tmp_path / "machine-a" / "start-model"
    with pytest.raises(ReplayError, match="name a local copy with --model"):
        plan_replay(bundle, None, None, [])
    plan = plan_replay(bundle, None, None, [], model=start_model)
    assert plan.model_path == start_model and plan.config.model.path == start_model
    other = tmp_path / "other-model"
    shutil.copytree(start_model, other)
    (other / "config.json").write_text('{"changed": true}')
    with pytest.raises(ReplayError, match="is not the model the run started from"):
        plan_replay(bundle, None, None, [], model=other)


def test_a_bundle_with_its_model_replays_from_the_start_alone(tmp_path: Path) -> None:
    _, bundle = exported(tmp_path, with_model=True)
    plan = plan_replay(bundle, None, None, [])
    assert plan.model_path == bundle / "model" and plan.first == 0
    (bundle / "model" / "config.json").write_text('{"altered": 1}')
    with pytest.raises(ReplayError, match="is not the model the run started from"):
        plan_replay(bundle, None, None, [])


def test_an_incomplete_altered_or_foreign_bundle_is_refused_naming_what(tmp_path: Path) -> None:
    _, bundle = exported(tmp_path, first=4)
    (bundle / "tokens" / "step_000005_rank1.npz").write_bytes(b"other bytes")
    with pytest.raises(BundleError, match="altered: tokens/step_000005_rank1.npz"):
        verify_bundle(bundle)
    with pytest.raises(ReplayError, match="altered"):
        plan_replay(bundle, None, None, [])
    (bundle / "tokens" / "step_000005_rank1.npz").unlink()
    with pytest.raises(BundleError, match="incomplete: tokens/step_000005_rank1.npz is missing"):
        verify_bundle(bundle)
    manifest = json.loads((bundle / BUNDLE_FILE).read_text())
    (bundle / BUNDLE_FILE).write_text(json.dumps({**manifest, "format_version": 2}))
    with pytest.raises(BundleError, match="format version 2; this version of pipelinerl reads version 1"):
        verify_bundle(bundle)
    (bundle / BUNDLE_FILE).write_text(json.dumps({**manifest, "format": "something else"}))
    with pytest.raises(BundleError, match="not a replay bundle"):
        verify_bundle(bundle)


def test_an_export_that_cannot_be_made_is_refused(tmp_path: Path) -> None:
    run_dir = write_run(tmp_path / "run", ranks=1)
    with pytest.raises(BundleError, match="--from 6 --to 6"):
        export_bundle(run_dir, tmp_path / "b", ranks=1, first=6)
    (run_dir / "digests" / "step_000005.json").unlink()
    with pytest.raises(BundleError, match="step_000005.json"):
        export_bundle(run_dir, tmp_path / "b", ranks=1)
    export_bundle(run_dir, tmp_path / "b", ranks=1, last=4)
    with pytest.raises(BundleError, match="not empty"):
        export_bundle(run_dir, tmp_path / "b", ranks=1, last=4)
