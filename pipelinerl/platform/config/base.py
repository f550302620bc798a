"""What every configuration section shares: the error users see and the section base model."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

Mode = Literal["pipeline", "conventional", "async"]
MODES: tuple[Mode, ...] = ("pipeline", "conventional", "async")


class ConfigError(ValueError):
    """A configuration that cannot run; the message is meant for the user as is."""


class Section(BaseModel):
    # allow_inf_nan=False: every float setting must be a finite number. An infinite one (``rl.is_cap=inf``)
    # was accepted, written to config.json as null (JSON has no infinity) and killed every stage at start.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, allow_inf_nan=False)


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


def schema_at(path: str, schema: dict[str, Any]) -> dict[str, Any]:
    """JSON Schema requiring the field at dotted ``path`` (``"rl.batch_size"``) to meet ``schema``."""
    *parents, leaf = path.split(".")
    nested: dict[str, Any] = {"properties": {leaf: schema}, "required": [leaf]}
    for parent in reversed(parents):
        nested = {"properties": {parent: nested}, "required": [parent]}
    return nested


def multiple_of_field(
    value: str, divisor: str, largest: int, when: tuple[dict[str, Any], ...] = ()
) -> list[dict[str, Any]]:
    """JSON Schema (``if``/``then`` entries for an ``allOf``) saying that the field ``value`` is a
    multiple of the field ``divisor`` (dotted paths from the same object), ``when`` those conditions
    hold too. JSON Schema's ``multipleOf`` takes a constant only, so there is one entry per possible
    divisor, 2 to ``largest`` (the divisor field's maximum)."""
    return [
        {
            "if": {"allOf": [schema_at(divisor, {"const": n}), *when]},
            "then": schema_at(value, {"multipleOf": n}),
        }
        for n in range(2, largest + 1)
    ]
