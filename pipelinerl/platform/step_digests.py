"""The policy's weights after each optimizer step, as digests: what a replay of the step is checked against.

With ``trainer.record_batches`` the trainer writes, after each step, ``digests/step_<version>.json``:
one BLAKE3 digest per parameter tensor (its raw bytes in row-major order, ``platform/weight_digest``)
in the model's parameter order, and one over all of them. A replay of the step (``pipelinerl replay``)
computes the same from the weights it trained and names the first tensor whose digest differs: two
runs of a step agree to the bit exactly when every digest agrees.

Pure apart from ``write_step_digests`` / ``read_step_digests``; no torch at import.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from blake3 import blake3

from pipelinerl.platform.atomic_file import write_atomically
from pipelinerl.platform.weight_digest import bucket_digest

if TYPE_CHECKING:
    import torch

DIGESTS_DIR = "digests"


class StepDigestsError(ValueError):
    """A digests file that cannot be read back; the message names it and the fault."""


@dataclass(frozen=True)
class StepDigests:
    """The weights of policy ``version``: each tensor's digest (hex) by name, in parameter order."""

    version: int
    tensors: dict[str, str]

    @property
    def weights(self) -> str:
        """One digest over every tensor's name and digest, in order."""
        return combined_digest(self.tensors)


def step_digests_path(run_dir: Path, version: int) -> Path:
    return run_dir / DIGESTS_DIR / f"step_{version:06d}.json"


def parameter_digests(named: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """The digest of each ``(name, tensor)``, in the order given."""
    return {name: bucket_digest([tensor]).hex() for name, tensor in named}


def combined_digest(tensors: dict[str, str]) -> str:
    hasher = blake3()
    for name, digest in tensors.items():
        hasher.update(f"{name}\t{digest}\n".encode())
    return hasher.hexdigest()


def first_difference(recorded: StepDigests, replayed: StepDigests) -> str | None:
    """The first tensor (in the recorded order) whose weights differ, with how; None when all agree."""
    for name, digest in recorded.tensors.items():
        other = replayed.tensors.get(name)
        if other is None:
            return f"tensor {name!r} is missing from the replayed weights"
        if other != digest:
            return f"tensor {name!r} differs (digest {digest[:16]} recorded, {other[:16]} replayed)"
    extra = [name for name in replayed.tensors if name not in recorded.tensors]
    if extra:
        return f"the replayed weights have tensors the record has not: {', '.join(extra[:5])}"
    return None


def write_step_digests(path: Path, digests: StepDigests) -> None:
    record = {"version": digests.version, "weights": digests.weights, "tensors": digests.tensors}
    write_atomically(path, json.dumps(record, indent=1), make_parents=True)


def read_step_digests(path: Path) -> StepDigests:
    try:
        record = json.loads(path.read_text())
        digests = StepDigests(version=int(record["version"]), tensors=dict(record["tensors"]))
    except FileNotFoundError:
        raise StepDigestsError(f"{str(path)!r} does not exist") from None
    except (ValueError, KeyError, TypeError) as error:
        raise StepDigestsError(f"{str(path)!r} is not a step's weight digests: {error}") from None
    if record.get("weights") != digests.weights:
        raise StepDigestsError(f"{str(path)!r} is damaged: its digest of all tensors does not match them")
    return digests
