"""A cost profile: the figures of a ``CostModel``, each with its unit and where it comes from.

A profile is JSON::

    {
      "name": "h100-7b",
      "description": "...",
      "figures": {
        "decode_base_s": {"value": 0.021, "unit": "s", "source": "vLLM 0.8 benchmark, ..."},
        ...
      },
      "hardware": {"gpu": "H100", "gpus_per_engine": 1, "trainer_gpus": 8, "model_params_b": 7.6,
                   "source": "..."}
    }

Every figure of ``CostModel`` must be there (a missing one is named), nothing else (an unknown one is
named with the valid ones), and each says where it comes from: a measured run, a benchmark record, a
published table. ``pipelinerl plan`` simulates with ``CostProfile.cost_model()``.

``hardware`` (optional) says what the figures were measured on: the GPU, the GPUs of one engine (its
tensor parallelism), the trainer GPUs the step times were measured with, and the model's size. A
profile with it can be scaled to another cluster of that GPU (``plan/cluster.py``); one without it (a
profile calibrated on this machine's CPU runs) predicts the configuration as its config gives it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from pipelinerl.plan.costs import CostModel
from pipelinerl.plan.lengths import parse_lengths
from pipelinerl.plan.transfer import LinkCosts

FIGURES = tuple(field.name for field in fields(CostModel) if field.name != "decode_table")
# Figures a profile may leave out: 0, each stage on its own devices (a GPU cluster).
OPTIONAL_FIGURES = ("actor_alone_speedup", "trainer_alone_speedup", "train_step_log_sd")


class ProfileError(ValueError):
    """A profile that cannot be used, with what is wrong in it."""


class Figure(BaseModel):
    model_config = ConfigDict(extra="forbid")

    value: float = Field(ge=0)
    unit: str = Field(min_length=1)
    source: str = Field(min_length=1, description="Where the value comes from: a run, a record, a paper.")


class Hardware(BaseModel):
    model_config = ConfigDict(extra="forbid")

    gpu: str = Field(min_length=1, description="The GPU the figures were measured on (plan/cluster.GPUS).")
    gpus_per_engine: int = Field(ge=1, description="GPUs of one inference engine (tensor parallel size).")
    trainer_gpus: int = Field(ge=1, description="Trainer GPUs the step-time figures were measured with.")
    model_params_b: float = Field(gt=0, description="The model's parameters, in billions.")
    kv_bytes_per_token: int | None = Field(
        None, ge=1, description="The model's KV cache a token (2 x layers x KV heads x head dim x 2 bytes)."
    )
    zero_stage: int = Field(3, ge=0, le=3, description="The ZeRO stage the trainer's step figures are for.")
    source: str = Field(min_length=1)


class DecodeTable(BaseModel):
    """The decode step measured at several H (``pipelinerl bench decode``): replaces the linear form."""

    model_config = ConfigDict(extra="forbid")

    points: list[tuple[float, float]] = Field(
        description="(sequences in flight, seconds of a decode step of that many)"
    )
    unit: str = "s"
    source: str = Field(min_length=1)


class Transfer(BaseModel):
    """The weight transfer as its link's costs (``plan/transfer.py``), so the transfer follows the
    config's bucket size instead of being one figure: with it, ``transfer_s`` is the transfer at the
    bucket size the profile was measured with, and a config with another bucket size gets its own."""

    model_config = ConfigDict(extra="forbid")

    link: str = Field(min_length=1, description="What carries the update: gloo through host memory, NCCL ...")
    bytes_per_s: float = Field(gt=0)
    per_bucket_s: float = Field(ge=0)
    fixed_s: float = Field(ge=0)
    update_bytes: int = Field(ge=1, description="The bytes of one update of the profile's model.")
    source: str = Field(min_length=1)

    def link_costs(self) -> LinkCosts:
        return LinkCosts(bytes_per_s=self.bytes_per_s, per_bucket_s=self.per_bucket_s, fixed_s=self.fixed_s)


class CostProfile(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    description: str = ""
    figures: dict[str, Figure]
    decode_table: DecodeTable | None = None
    hardware: Hardware | None = None
    transfer: Transfer | None = None
    lengths: str | None = Field(
        None,
        description="The completion lengths the profile's figures go with, in a --lengths form other than "
        "run: (plan takes them when it is given none)",
    )

    @field_validator("lengths")
    @classmethod
    def _lengths_readable(cls, lengths: str | None) -> str | None:
        if lengths is not None:
            if lengths.startswith("run:"):
                raise ValueError(f"{lengths!r}: a profile's lengths are a form that travels, not run:RUN_DIR")
            parse_lengths(lengths, max_tokens=2**31)  # ValueError naming the form
        return lengths

    @field_validator("figures")
    @classmethod
    def _every_figure_once(cls, figures: dict[str, Figure]) -> dict[str, Figure]:
        unknown = sorted(set(figures) - set(FIGURES))
        if unknown:
            raise ValueError(f"unknown figure {', '.join(unknown)}; the figures are {', '.join(FIGURES)}")
        missing = [name for name in FIGURES if name not in figures and name not in OPTIONAL_FIGURES]
        if missing:
            raise ValueError(f"missing figure {', '.join(missing)}")
        return figures

    def cost_model(self, bucket_bytes: int | None = None) -> CostModel:
        """The simulator's costs; with ``bucket_bytes`` (a config's ``transport.weight_bucket_mib``) and a
        ``transfer`` section, the transfer is the link's time for the profile's model in such buckets."""
        table = tuple(self.decode_table.points) if self.decode_table is not None else ()
        values = {name: figure.value for name, figure in self.figures.items()}
        if bucket_bytes is not None and self.transfer is not None:
            values["transfer_s"] = self.transfer.link_costs().seconds(
                self.transfer.update_bytes, bucket_bytes
            )
        return CostModel(**values, decode_table=table)


def load_profile(path: Path) -> CostProfile:
    """The profile in ``path``; ``ProfileError`` naming the file and what is wrong with it."""
    try:
        text = path.read_text()
    except OSError as error:
        raise ProfileError(f"profile {path}: cannot be read ({error.strerror})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProfileError(f"profile {path}: not JSON ({error})") from None
    try:
        profile = CostProfile.model_validate(data)
        profile.cost_model()  # the figures' own checks (a decode step that takes no time)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'profile'}: {problem['msg']}"
            for problem in error.errors()
        )
        raise ProfileError(f"profile {path}: {problems}") from None
    except ValueError as error:
        raise ProfileError(f"profile {path}: {error}") from None
    return profile


SHIPPED = Path(__file__).parent / "profiles"  # the profiles the platform ships (docs/plan.md: sources)


def shipped_profiles() -> dict[str, Path]:
    """The shipped profiles by name (their file's stem)."""
    return {path.stem: path for path in sorted(SHIPPED.glob("*.json"))}


def resolve_profile(given: str) -> CostProfile:
    """A profile given by its file's path, or by the name of a shipped one; ``ProfileError`` naming
    the value and the shipped names when it is neither."""
    path = Path(given)
    if path.suffix == ".json" or path.exists():
        return load_profile(path)
    shipped = shipped_profiles()
    if given in shipped:
        return load_profile(shipped[given])
    raise ProfileError(
        f"profile {given!r}: no such file, nor a shipped profile; the shipped ones are "
        f"{', '.join(shipped) or '(none)'}"
    )
