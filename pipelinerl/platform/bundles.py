"""A replay bundle: what reproduces a run's training, in one directory that can move to another machine.

``pipelinerl runs export RUN --bundle PATH [--from V] [--to V] [--with-model]`` writes, under ``PATH``,
the run directory's files a replay of versions ``from`` .. ``to`` reads, at the same relative paths
(so a bundle *is* a run directory to ``pipelinerl replay``): ``config.json``, ``start.json``,
``metrics.jsonl``, the checkpoint the replay resumes from (``checkpoints/v<version>/``, none when it
resumes from the start), and, per replayed step, its batch records, token data and weight digests.
``bundle.json`` lists every file with its BLAKE3 digest, the format, and the starting model by its
digest: the model itself is copied in (``model/``) only with ``--with-model`` (a Hub model is usually
on the other machine already), and a replay that needs it elsewhere names a local copy (``--model``)
whose digest must match.

Nothing in a bundle names a path of the machine it was made on: every path is relative to the bundle.
A bundle whose files are missing or altered, or whose format this version does not read, is refused
naming what is wrong (``verify_bundle``).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from blake3 import blake3

from pipelinerl.platform.atomic_file import write_atomically
from pipelinerl.platform.batch_records import batch_record_path
from pipelinerl.platform.checkpoint import RunStart, policy_at_or_before, read_start, write_start
from pipelinerl.platform.config import PipelineConfig, with_overrides
from pipelinerl.platform.jsonl import step_records
from pipelinerl.platform.step_digests import step_digests_path
from pipelinerl.platform.tracking.metric_registry import CHECKPOINT

BUNDLE_FILE = "bundle.json"
FORMAT = "pipelinerl-replay-bundle"
FORMAT_VERSION = 1
BUNDLED_MODEL = "model"
_CHUNK = 16 * 2**20


class BundleError(ValueError):
    """A bundle that cannot be made or read; the message names the file or value and what is wrong."""


@dataclass(frozen=True)
class Manifest:
    run_id: str
    first: int  # the version a replay of the bundle resumes at
    last: int
    model_digest: str
    model_included: bool
    files: dict[str, str]  # relative path -> BLAKE3 digest (hex)

    def as_record(self) -> dict[str, object]:
        return {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "run_id": self.run_id,
            "versions": [self.first, self.last],
            "model_digest": self.model_digest,
            "model_included": self.model_included,
            "created_at": time.time(),
            "files": self.files,
        }


def file_digest(path: Path) -> str:
    hasher = blake3(max_threads=blake3.AUTO)
    with path.open("rb") as handle:
        while chunk := handle.read(_CHUNK):
            hasher.update(chunk)
    return hasher.hexdigest()


def model_digest(model_dir: Path) -> str:
    """One digest over every file of a model directory (relative path and content), in path order."""
    hasher = blake3()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        hasher.update(f"{path.relative_to(model_dir).as_posix()}\t{file_digest(path)}\n".encode())
    return hasher.hexdigest()


def _files_of_steps(run_dir: Path, versions: range, ranks: int) -> list[Path]:
    files = []
    for version in versions:
        files += [batch_record_path(run_dir, version, rank) for rank in range(ranks)]
        files += [run_dir / "tokens" / f"step_{version:06d}_rank{rank}.npz" for rank in range(ranks)]
        files.append(step_digests_path(run_dir, version))
    return files


def _relative_paths(record: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """``record`` with the checkpoint it names relative to the run directory."""
    named = record.get(CHECKPOINT)
    if isinstance(named, str) and Path(named).is_relative_to(run_dir):
        return {**record, CHECKPOINT: Path(named).relative_to(run_dir).as_posix()}
    return record


def export_bundle(
    run_dir: Path,
    bundle: Path,
    ranks: int,
    first: int | None = None,
    last: int | None = None,
    with_model: bool = False,
    progress: Callable[[str], None] | None = None,
) -> Manifest:
    """Write the bundle of ``run_dir``'s versions ``first`` (resumed at the checkpoint at or before it)
    .. ``last`` under ``bundle`` (a new directory); returns its manifest."""
    say = progress or (lambda _: None)
    steps = step_records(run_dir)
    if not steps:
        raise BundleError(f"{str(run_dir)!r} recorded no optimizer step (metrics.jsonl is empty or missing)")
    start = read_start(run_dir)
    last = max(steps) if last is None else last
    asked = start.policy_version if first is None else first
    if not start.policy_version <= asked < last <= max(steps):
        raise BundleError(
            f"--from {asked} --to {last}: the run recorded versions {start.policy_version + 1}..{max(steps)}"
        )
    model_path, resumed_at, is_checkpoint = policy_at_or_before(run_dir, asked)
    versions = range(resumed_at + 1, last + 1)
    files = _files_of_steps(run_dir, versions, ranks)
    if missing := [path for path in files if not path.is_file()]:
        raise BundleError(
            f"{len(missing)} file(s) a replay of versions {versions.start}..{last} needs are missing "
            f"(was trainer.record_batches off?), e.g. {missing[0]}"
        )
    if bundle.exists() and any(bundle.iterdir()):
        raise BundleError(f"--bundle {str(bundle)!r} is not empty: a bundle is written into a new directory")
    if is_checkpoint:
        files += [path for path in sorted(model_path.rglob("*")) if path.is_file()]
    bundle.mkdir(parents=True, exist_ok=True)
    for i, path in enumerate(files, 1):
        target = bundle / path.relative_to(run_dir)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
        if i % 50 == 0:
            say(f"copied {i} of {len(files)} files")
    # The config without this machine's paths: the replay names the models it resumes from.
    config = PipelineConfig.model_validate_json((run_dir / "config.json").read_text())
    portable = with_overrides(
        config, {"run.output_dir": ".", "run.home": ".", "run.resume_from": None, "model.path": None}
    )
    write_atomically(bundle / "config.json", portable.model_dump_json(indent=2))
    # The steps up to the last one, as the run recorded them (the replay compares against them).
    kept = [json.dumps(_relative_paths(steps[v], run_dir)) + "\n" for v in sorted(steps) if v <= last]
    write_atomically(bundle / "metrics.jsonl", "".join(kept))
    start_model = start.model_path
    say(f"hashing the starting model {start_model}")
    digest = model_digest(start_model) if start_model.is_dir() else ""
    if with_model:
        if not start_model.is_dir():
            raise BundleError(f"--with-model: the run's starting model {str(start_model)!r} is not here")
        shutil.copytree(start_model, bundle / BUNDLED_MODEL)
    # Relative: model/ in the bundle, or (not bundled) where a replay is told to find it (--model).
    write_start(bundle, RunStart(model_path=Path(BUNDLED_MODEL), policy_version=start.policy_version))
    say("hashing the bundle")
    listed = {
        path.relative_to(bundle).as_posix(): file_digest(path)
        for path in sorted(bundle.rglob("*"))
        if path.is_file()
        and path.name != BUNDLE_FILE
        and BUNDLED_MODEL not in path.relative_to(bundle).parts[:1]
    }
    manifest = Manifest(run_dir.name, resumed_at, last, digest, with_model, listed)
    write_atomically(bundle / BUNDLE_FILE, json.dumps(manifest.as_record(), indent=1))
    return manifest


def is_bundle(path: Path) -> bool:
    return (path / BUNDLE_FILE).is_file()


def read_manifest(bundle: Path) -> Manifest:
    path = bundle / BUNDLE_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BundleError(f"{str(path)!r} cannot be read as a bundle manifest: {error}") from None
    if record.get("format") != FORMAT:
        raise BundleError(
            f"{str(path)!r} is not a replay bundle's manifest (format {record.get('format')!r})"
        )
    if record.get("format_version") != FORMAT_VERSION:
        raise BundleError(
            f"{str(bundle)!r} is a bundle of format version {record.get('format_version')!r}; this version "
            f"of pipelinerl reads version {FORMAT_VERSION}"
        )
    try:
        first, last = record["versions"]
        return Manifest(
            str(record["run_id"]),
            int(first),
            int(last),
            str(record["model_digest"]),
            bool(record["model_included"]),
            dict(record["files"]),
        )
    except (KeyError, TypeError, ValueError) as error:
        raise BundleError(f"{str(path)!r} is missing or misstates {error}") from None


def verify_bundle(bundle: Path) -> Manifest:
    """The bundle's manifest, once every file it lists is there with its digest."""
    manifest = read_manifest(bundle)
    for relative, digest in manifest.files.items():
        path = bundle / relative
        if not path.is_file():
            raise BundleError(f"the bundle {str(bundle)!r} is incomplete: {relative} is missing")
        if file_digest(path) != digest:
            raise BundleError(f"the bundle {str(bundle)!r} is altered: {relative} does not match its digest")
    return manifest


def bundle_start_model(bundle: Path, manifest: Manifest, model: Path | None) -> Path | None:
    """The bundle's starting model: ``model/`` when bundled, else ``model`` (a local copy, checked
    against the digest), else None (a replay that resumes from the bundle's checkpoint may not need it)."""
    if manifest.model_included:
        model = bundle / BUNDLED_MODEL
    elif model is None:
        return None
    if not (model / "config.json").is_file():
        raise BundleError(f"--model {str(model)!r} is not a model directory (it has no config.json)")
    if manifest.model_digest and model_digest(model) != manifest.model_digest:
        raise BundleError(
            f"{str(model)!r} is not the model the run started from (its digest differs from the bundle's "
            f"{manifest.model_digest[:16]}…)"
        )
    return model
