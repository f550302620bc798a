"""Models and datasets named by Hugging Face Hub id, resolved once to a local snapshot.

A setting that takes a local path (``model.path``, the math task's ``dataset``) also takes a Hub id,
``org/name``, with its revision in a setting of its own (``model.revision``, ``dataset_revision``):
a branch, a tag or a commit hash; empty means ``main``. An existing local path always wins over an
id spelled the same way.

The launcher resolves each id before any stage starts (``resolve_snapshot``): the snapshot is
downloaded into the Hugging Face cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``) or into the
directory a setting names (``model.cache_dir``: shared storage for stages on other nodes), and the
stages load that directory. Offline (``HF_HUB_OFFLINE=1``) only the cache is read: an id that is not
there fails with the command that fetches it.

This module imports ``huggingface_hub`` only inside ``resolve_snapshot``: the id checks are cheap
enough for config validation.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pipelinerl.platform.config.base import ConfigError
from pipelinerl.platform.config.hub_ids import hub_id_problem, is_hub_id, looks_like_hub_id

__all__ = ["Snapshot", "hub_id_problem", "is_hub_id", "looks_like_hub_id", "resolve_snapshot"]

RepoType = Literal["model", "dataset"]
COMMIT = re.compile(r"^[0-9a-f]{40}$")
# Weight formats no stage loads: not downloaded with a model (TensorFlow, Flax, ONNX, GGUF, Llama's
# original consolidated checkpoints).
_IGNORED = ["*.h5", "*.msgpack", "*.onnx", "*.ot", "*.gguf", "onnx/*", "original/*", "openvino/*"]
_TRUE = {"1", "ON", "YES", "TRUE"}


@dataclass(frozen=True)
class Snapshot:
    """A resolved Hub id: the local snapshot directory and the commit it holds."""

    repo_id: str
    revision: str | None
    commit: str
    path: Path


def hub_cache_dir(cache_dir: Path | None = None) -> Path:
    """Where snapshots go: ``cache_dir`` if given, else HF_HUB_CACHE, else HF_HOME/hub, else
    huggingface_hub's default (read now, not when huggingface_hub was imported)."""
    if cache_dir is not None:
        return cache_dir.expanduser()
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    from huggingface_hub import constants  # noqa: PLC0415 (only when resolving)

    return Path(constants.HF_HUB_CACHE)


def hub_offline() -> bool:
    if os.environ.get("HF_HUB_OFFLINE", "").upper() in _TRUE:
        return True
    from huggingface_hub import constants  # noqa: PLC0415 (only when resolving)

    return bool(constants.HF_HUB_OFFLINE)


def fetch_command(repo_id: str, revision: str | None, repo_type: RepoType, cache_dir: Path | None) -> str:
    """The ``hf`` command (huggingface_hub >= 1.0) that puts the snapshot where the resolver looks."""
    parts = ["hf download", repo_id]
    if repo_type == "dataset":
        parts.append("--repo-type dataset")
    if revision:
        parts.append(f"--revision {revision}")
    if cache_dir is not None:
        parts.append(f"--cache-dir {cache_dir}")
    return " ".join(parts)


def resolve_snapshot(
    repo_id: str,
    *,
    revision: str | None = None,
    repo_type: RepoType = "model",
    cache_dir: Path | None = None,
    setting: str = "model.path",
) -> Snapshot:
    """The local snapshot of ``repo_id`` at ``revision``: downloaded unless offline (then the cache only).
    ConfigError, one line naming the id and revision and how to fetch it, when it cannot be had."""
    if not looks_like_hub_id(repo_id) or (problem := hub_id_problem(repo_id)) is not None:
        why = problem if looks_like_hub_id(repo_id) else "give 'org/name'"
        raise ConfigError(f"{setting}={repo_id!r} is not a valid Hugging Face Hub id: {why}")
    from huggingface_hub import snapshot_download  # noqa: PLC0415 (only when resolving)
    from huggingface_hub.errors import (  # noqa: PLC0415 (only when resolving)
        GatedRepoError,
        HfHubHTTPError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = hub_cache_dir(cache_dir)
    offline = hub_offline()
    label = repo_id + (f" at revision {revision!r}" if revision else "")
    fetch = fetch_command(repo_id, revision, repo_type, cache_dir)
    try:
        path = Path(
            str(
                snapshot_download(
                    repo_id,
                    repo_type=repo_type,
                    revision=revision,
                    cache_dir=cache,
                    local_files_only=offline,
                    ignore_patterns=_IGNORED if repo_type == "model" else None,
                )
            )
        )
    except GatedRepoError:
        raise ConfigError(
            f"{setting}: {repo_type} {label} is gated on the Hugging Face Hub: accept its terms on the Hub "
            f"and log in (hf auth login), then: {fetch}"
        ) from None
    except RevisionNotFoundError:
        raise ConfigError(f"{setting}: the Hub {repo_type} {repo_id} has no revision {revision!r}") from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"{setting}: no {repo_type} {repo_id!r} on the Hugging Face Hub (or it is private: hf auth login)"
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError) as error:
        where = (
            "offline (HF_HUB_OFFLINE)"
            if offline
            else f"the Hub could not be reached ({type(error).__name__})"
        )
        raise ConfigError(
            f"{setting}: {repo_type} {label} is not in the Hugging Face cache {cache} and {where}; "
            f"fetch it first: {fetch}"
        ) from None
    commit = path.name
    if not COMMIT.match(commit):  # not the cache layout snapshots/<commit>: say so rather than guess
        raise ConfigError(f"{setting}: {label} resolved to {path}, not a snapshots/<commit> directory")
    return Snapshot(repo_id=repo_id, revision=revision, commit=commit, path=path)
