"""What ``pipelinerl plan`` takes when it is given no ``--profile`` or no ``--lengths``.

* **The profile.** Without ``--cluster``: ``cpu-2core``, the profile of this machine's kind (the
  embedded default on 2 CPU cores). With ``--cluster``: the shipped profile of the cluster's GPU whose
  model is nearest in size (on a log scale) to the config's; the size is read off the model's name
  (``Qwen/Qwen2.5-7B-Instruct``: 7B; ``Qwen3-0.6B``: 0.6B). A model whose name gives no size (the embedded
  default, a local directory) takes that GPU's smallest.
* **The lengths.** The profile's own (``CostProfile.lengths``: the completions its figures go with; the
  GPU profiles carry the paper's stand-in, ``plan/paper.py``), cut at ``actor.max_new_tokens``.

Each choice comes with its reason in words, which the command prints.
"""

from __future__ import annotations

import math
import re
from pathlib import PurePath

from pipelinerl.plan.lengths import LENGTH_FORMS
from pipelinerl.plan.profile import CostProfile, ProfileError, load_profile, shipped_profiles

MACHINE_PROFILE = "cpu-2core"
# "7B", "0.5B", "1.5b", "32B" in a model's name; not "8bit" nor "B200"
_SIZE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)[Bb](?![A-Za-z0-9])")


def params_b_of(model: str | None) -> float | None:
    """The parameters, in billions, a model's Hub id or directory names (its last part), or None."""
    if not model:
        return None
    name = PurePath(model).name or model
    sizes = [float(size) for size in _SIZE.findall(name.replace("_", "-"))]
    return sizes[-1] if sizes else None


def choose_profile(gpu: str | None, model: str | None) -> tuple[str, str]:
    """The shipped profile for a cluster of ``gpu`` (None: no cluster) and the config's ``model``
    (``model.path``), with the reason; ``ProfileError`` naming the GPU when no profile describes it."""
    if gpu is None:
        return MACHINE_PROFILE, f"no --cluster: {MACHINE_PROFILE}, the profile of this machine's kind"
    shipped = {name: load_profile(path) for name, path in shipped_profiles().items()}
    sizes = {
        name: profile.hardware.model_params_b
        for name, profile in shipped.items()
        if profile.hardware is not None and profile.hardware.gpu == gpu
    }
    if not sizes:
        gpus = sorted({p.hardware.gpu for p in shipped.values() if p.hardware is not None})
        raise ProfileError(
            f"no shipped profile describes {gpu}; they describe {', '.join(gpus)}: give --profile "
            "(`pipelinerl plan calibrate` makes one from runs)"
        )
    params = params_b_of(model)
    if params is None:
        name = min(sizes, key=sizes.__getitem__)
        return name, (
            f"{gpu} and a model whose name gives no size ({model or 'the embedded default'}): {name}, "
            f"the smallest {gpu} profile"
        )
    name = min(sizes, key=lambda candidate: abs(math.log(sizes[candidate] / params)))
    return name, f"{gpu} and a {params:g}B model: {name} ({sizes[name]:g}B, the nearest in size)"


def profile_lengths(profile: CostProfile) -> tuple[str, str]:
    """The profile's own lengths, with the reason; ``ProfileError`` when it carries none."""
    if profile.lengths is None:
        raise ProfileError(f"profile {profile.name!r} carries no lengths: give --lengths ({LENGTH_FORMS})")
    return profile.lengths, f"the lengths {profile.name} goes with: {profile.lengths}"
