"""What every configuration section shares: the error users see and the section base model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Mode = Literal["pipeline", "conventional", "async"]
MODES: tuple[Mode, ...] = ("pipeline", "conventional", "async")


class ConfigError(ValueError):
    """A configuration that cannot run; the message is meant for the user as is."""


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


def requires_when(*rules: tuple[str, dict[str, Any], str, Any]) -> dict[str, Any]:
    """JSON Schema (``allOf`` of ``if``/``then``) for a section's cross-field rules: each
    ``(field, condition, other, value)`` says that when ``field`` meets the JSON Schema ``condition``,
    ``other`` must be ``value``. The pydantic validators enforce the same rules; in the schema, forms
    built from it (Prefect's run form) refuse a violation before a run is submitted."""
    return {
        "allOf": [
            {
                "if": {"properties": {field: condition}, "required": [field]},
                "then": {"properties": {other: {"const": value}}, "required": [other]},
            }
            for field, condition, other, value in rules
        ]
    }
