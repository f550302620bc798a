"""What every configuration section shares: the error users see and the section base model."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

Mode = Literal["pipeline", "conventional", "async"]
MODES: tuple[Mode, ...] = ("pipeline", "conventional", "async")


class ConfigError(ValueError):
    """A configuration that cannot run; the message is meant for the user as is."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)
