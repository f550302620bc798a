"""An offline Hugging Face Hub cache filled from local directories, in the layout huggingface_hub reads:
``<cache>/<type>s--<org>--<name>/snapshots/<commit>/...`` and ``refs/<ref>`` holding the commit.

huggingface_hub links snapshot files to ``blobs/``; a snapshot of plain files is read the same way
(offline resolution only checks ``refs/`` and the snapshot folder), which keeps the tests simple.
"""

from __future__ import annotations

import hashlib
import json
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


def write_math_repo(root: Path, subsets: tuple[str, ...] = ("main",)) -> Path:
    """A Hub dataset repository laid out as openai/gsm8k: one folder of shards per subset."""
    for subset in subsets:
        folder = root / subset
        folder.mkdir(parents=True)
        for split, count in (("train", 12), ("test", 4)):
            rows = [
                {
                    "question": f"{subset} {split} {i}: what is {i} + {i}?",
                    "answer": f"{i} + {i}\n#### {2 * i}",
                }
                for i in range(count)
            ]
            (folder / f"{split}-00000-of-00001.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (root / "README.md").write_text("a dataset card")
    return root


def gsm8k_settings(dataset_id: str) -> list[str]:
    """The math task on a gsm8k-shaped Hub dataset (``write_math_repo``) named by ``dataset_id``."""
    return [
        "task.name=math",
        f"task.options.dataset={dataset_id}",
        "task.options.dataset_subset=main",
        "task.options.question_field=question",
        "task.options.answer_field=answer",
        "task.options.answer_format=gsm8k",
    ]
