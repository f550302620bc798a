"""The ``rl`` section: how the trainer learns from the samples (the loss and its options, the group,
advantages and normalisation, the KL term, the entropy bonus, the overlong penalty; docs/recipes.md)."""

from __future__ import annotations

from typing import Literal

from pydantic import ConfigDict, Field, model_validator

from pipelinerl.platform.config.base import Section, multiple_of_field, schema_at


class KLConfig(Section):
    coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the KL penalty to a frozen reference policy (the starting weights: the warm "
        "start or model.path), added to the loss per token; 0: off, and no reference model is loaded.",
    )
    estimator: Literal["k1", "k2", "k3"] = Field(
        "k3",
        description="KL estimator per token, from r = ref/pi: k1 = -log r, k2 = (log r)^2 / 2, "
        "k3 = r - 1 - log r (non-negative, unbiased; Schulman's approximation).",
    )


class OverlongConfig(Section):
    enabled: bool = Field(
        False,
        description="DAPO's soft overlong punishment: a completion longer than actor.max_new_tokens minus "
        "rl.overlong.buffer tokens has its reward lowered linearly, down to -1 at actor.max_new_tokens.",
    )
    buffer: int = Field(
        32,
        ge=1,
        description="rl.overlong.enabled: the last this many tokens before actor.max_new_tokens in which the "
        "penalty grows from 0 to -1; must be below actor.max_new_tokens.",
    )


class RLConfig(Section):
    # batch_size a multiple of group_size, and the loss's options only where the loss takes them, in JSON
    # Schema too (Prefect's form refuses a violation).
    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                *multiple_of_field("batch_size", "group_size", 256),
                {
                    "if": schema_at("loss", {"const": "truncated_is"}),
                    "then": {"properties": {"clip_low": {"type": "null"}, "clip_high": {"type": "null"}}},
                },
                {
                    "if": schema_at("loss", {"const": "gspo"}),
                    "then": {"properties": {"loss_normalisation": {"const": "sequence"}}},
                },
                {
                    "if": schema_at("overlong.enabled", {"const": True}),
                    "then": {"properties": {"truncated": {"enum": ["train", "mask"]}}},
                },
            ]
        }
    )

    group_size: int = Field(4, ge=2, le=256, description="Samples per prompt; advantages are leave-one-out.")
    batch_size: int = Field(32, ge=1, description="B: sequences per optimizer step.")
    loss: Literal["truncated_is", "ppo_clip", "gspo", "cispo"] = Field(
        "truncated_is",
        description="The policy loss (docs/recipes.md): truncated_is (REINFORCE, weights min(r, rl.is_cap)), "
        "ppo_clip (PPO's clipped surrogate), gspo (sequence-level clipped ratio), cispo (REINFORCE with "
        "clipped, detached importance weights).",
    )
    is_cap: float = Field(
        5.0, gt=0, description="truncated_is: c, cap of the truncated importance weight min(r, c)."
    )
    ppo_clip_epsilon: float = Field(
        0.2,
        gt=0,
        lt=1,
        description="ppo_clip: epsilon of the symmetric clip range [1 - eps, 1 + eps] (rl.clip_low and "
        "rl.clip_high replace either side).",
    )
    clip_low: float | None = Field(
        None,
        gt=0,
        lt=1,
        description="ppo_clip, gspo, cispo: the ratio's lower bound is 1 - clip_low. Empty: the loss's own "
        "default (ppo_clip: rl.ppo_clip_epsilon; gspo: 3e-4; cispo: no lower bound). Not for truncated_is.",
    )
    clip_high: float | None = Field(
        None,
        gt=0,
        description="ppo_clip, gspo, cispo: the ratio's upper bound is 1 + clip_high (clip-higher: above "
        "clip_low). Empty: the loss's own default (ppo_clip: rl.ppo_clip_epsilon; gspo: 4e-4; cispo: 0.28). "
        "Not for truncated_is (its bound is rl.is_cap).",
    )
    loss_normalisation: Literal["sequence", "token", "constant"] = Field(
        "sequence",
        description="What the step's summed token terms are divided by: sequence (its sequences, the "
        "paper's), token (its completion tokens), constant (sequences x actor.max_new_tokens, Dr. GRPO).",
    )
    kl: KLConfig = Field(default_factory=KLConfig, description="KL penalty to a frozen reference policy.")
    entropy_coef: float = Field(
        0.0,
        ge=0,
        description="Weight of the entropy bonus (the mean token entropy of the policy at the sampling "
        "temperature, subtracted from the loss); 0: off.",
    )
    overlong: OverlongConfig = Field(
        default_factory=OverlongConfig, description="DAPO's soft punishment of overlong completions."
    )
    normalize_advantages: bool = Field(False, description="Divide group advantages by the group std.")
    truncated: Literal["train", "mask", "penalise"] = Field(
        "train",
        description="A completion cut at actor.max_new_tokens: trained like any other (train), kept in its "
        "group's baseline with advantage 0 so it adds nothing to the loss (mask), or given reward "
        "-rl.truncated_penalty (penalise).",
    )
    truncated_penalty: float = Field(
        1.0, ge=0, description="rl.truncated=penalise: the reward is minus this."
    )
    format_reward: float = Field(
        0.0,
        ge=0,
        description="Added to the reward of a completion whose answer could be read (correct or wrong).",
    )
    drop_zero_variance_groups: bool = Field(
        False,
        description="Drop groups whose rewards are all equal (zero advantages, no signal: dynamic sampling); "
        "counted in samples/dropped_zero_variance.",
    )
    max_lag: int | None = Field(
        None,
        ge=0,
        description="Hard staleness bound: a sequence with a token more than this many versions older than "
        "the policy it would train is dropped and counted (samples/dropped_stale). Empty: no bound.",
    )

    @model_validator(mode="after")
    def _batch_holds_whole_groups(self) -> RLConfig:
        if self.batch_size % self.group_size:
            raise ValueError(
                f"rl.batch_size={self.batch_size} must be a multiple of rl.group_size={self.group_size} "
                "so that every batch holds whole groups"
            )
        return self

    @model_validator(mode="after")
    def _recipe_options_fit_the_loss(self) -> RLConfig:
        if self.loss == "truncated_is":
            given = [
                f"rl.{name}={value}"
                for name, value in (("clip_low", self.clip_low), ("clip_high", self.clip_high))
                if value is not None
            ]
            if given:
                raise ValueError(
                    f"{' and '.join(given)} with rl.loss='truncated_is': its weights are only capped "
                    "above, at rl.is_cap; clip bounds are for rl.loss = 'ppo_clip', 'gspo' or 'cispo' (or "
                    "leave rl.clip_low and rl.clip_high empty)"
                )
        if self.loss == "gspo" and self.loss_normalisation != "sequence":
            raise ValueError(
                f"rl.loss_normalisation={self.loss_normalisation!r} with rl.loss='gspo': gspo's terms are "
                "per sequence (each already the mean over its tokens), so they are divided by the step's "
                "sequences; use rl.loss_normalisation = 'sequence' with gspo"
            )
        if self.overlong.enabled and self.truncated == "penalise":
            raise ValueError(
                "rl.overlong.enabled=true with rl.truncated='penalise' would punish a truncated completion "
                "twice (-rl.truncated_penalty, then the overlong penalty); use rl.truncated = 'train' or "
                "'mask' with the overlong penalty"
            )
        return self
