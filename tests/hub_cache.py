"""An offline Hugging Face Hub cache filled from local directories, in the layout huggingface_hub reads:
``<cache>/<type>s--<org>--<name>/snapshots/<commit>/...`` and ``refs/<ref>`` holding the commit.

huggingface_hub links snapshot files to ``blobs/``; a snapshot of plain files is read the same way
(offline resolution only checks ``refs/`` and the snapshot folder), which keeps the tests simple.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


def fake_commit(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()


def add_to_cache(
    cache: Path,
    repo_id: str,
    source: Path,
    *,
    repo_type: str = "model",
    refs: tuple[str, ...] = ("main",),
    commit: str | None = None,
) -> Path:
    """Put ``source``'s files into ``cache`` as ``repo_id`` at ``commit`` (named by each of ``refs``);
    returns the snapshot directory."""
    commit = commit or fake_commit(f"{repo_type}:{repo_id}:{source}")
    repo = cache / f"{repo_type}s--{repo_id.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    shutil.copytree(source, snapshot, dirs_exist_ok=True)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    for ref in refs:
        (repo / "refs" / ref).write_text(commit)
    return snapshot
