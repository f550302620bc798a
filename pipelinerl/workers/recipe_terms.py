"""The recipe's extra terms on the trainer (docs/recipes.md): the KL term's frozen reference model, and
the step's loss diagnostics gathered from its micro-batches (clipped fractions, KL, entropy)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
from transformers import AutoModelForCausalLM

from pipelinerl.platform.config import PipelineConfig
from pipelinerl.platform.dtypes import policy_dtype
from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.workers.engines.lm_head import float32_lm_head

logger = logging.getLogger(__name__)


def recipe_metrics(
    results: list[tuple[int, float, float, float, float | None, float | None]],
    kl_coef: float,
    entropy_coef: float,
) -> dict[str, float]:
    """The step's loss diagnostics from its micro-batches' (tokens, clipped, clipped low, clipped high,
    KL mean, entropy mean), every rank's: each a share or mean over the step's tokens. KL and entropy
    only when their term is on (the reference model or the entropy are computed only then)."""
    weights = [result[0] for result in results]
    metrics = {
        name: weighted_mean([result[index] or 0.0 for result in results], weights)
        for name, index in (
            (registry.CLIPPED_FRACTION, 1),
            (registry.CLIPPED_LOW_FRACTION, 2),
            (registry.CLIPPED_HIGH_FRACTION, 3),
        )
    }
    if kl_coef > 0:
        metrics[registry.KL_MEAN] = weighted_mean([result[4] or 0.0 for result in results], weights)
    if entropy_coef > 0:
        metrics[registry.ENTROPY_MEAN] = weighted_mean([result[5] or 0.0 for result in results], weights)
    return metrics


def reference_model_path(config: PipelineConfig, model_path: Path) -> Path:
    """Where the KL reference's weights are: the weights the run started from. A resumed run loads its
    policy from the checkpoint (``model_path``); its reference stays ``model.path`` when that is a local
    directory (a warm start cached elsewhere is not known here: the checkpoint is taken then)."""
    if config.run.resume_from is not None and config.model.path is not None:
        start = config.model.path.expanduser()
        if start.is_dir():
            return start
        logger.warning("KL reference: model.path %s is not a local directory; using %s", start, model_path)
    return model_path


def load_reference_model(config: PipelineConfig, path: Path, device: Any) -> Any:
    """The frozen reference policy of the KL term: eval mode, no gradients, on the trainer's device, in
    the policy's precision; never handed to DeepSpeed (one full copy per rank, also under ZeRO-3)."""
    model = AutoModelForCausalLM.from_pretrained(path, dtype=policy_dtype(config.model.dtype))
    if config.model.lm_head_fp32:
        float32_lm_head(model)
    model.requires_grad_(False)
    return model.to(device).eval()


def weighted_mean(values: list[float], weights: list[int]) -> float:
    """The mean of ``values`` weighted by ``weights`` (0.0 when they sum to 0)."""
    total = sum(weights)
    return float(np.dot(values, weights) / total) if total else 0.0
