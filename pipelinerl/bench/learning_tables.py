"""The tables of ``pipelinerl bench learning``: a record's variants (``table_rows``) and the paper's
claims redrawn from finished runs (``claim_rows``), as rows for ``report.markdown_table``."""

from __future__ import annotations

from typing import Any

from pipelinerl.platform.tracking.ratios import pipeline_times_faster

TABLE_HEADERS = (
    "variant",
    "time to target (s)",
    "PipelineRL × faster (this variant's time ÷ PipelineRL's)",
    "final success",
    "ESS mean",
    "ESS min",
    "lag mean",
    "lag p90",
    "lag max",
    "actor idle",
    "trainer idle",
    "samples/s",
    "tokens/s",
    "lag, first / last quarter of positions",
    "sequences with 2+ versions",
    "completion tokens mean / p50 / p90 / max",
)


def table_rows(record: dict[str, Any]) -> list[list[Any]]:
    return [
        [
            row["variant"],
            row["time_to_target_s"],
            pipeline_times_faster(record, row["variant"]),
            row["eval_success_end"],
            row["ess_mean"],
            row["ess_min"],
            row["lag_mean"],
            row["lag_p90"],
            row["lag_max"],
            row["actor_idle_fraction"],
            row["trainer_idle_fraction"],
            row["samples_per_s"],
            row["tokens_per_s"],
            _pair(row.get("lag_early"), row.get("lag_late")),
            row.get("multi_version_fraction"),
            _lengths(row.get("completion_lengths") or {}),
        ]
        for row in record["variants"]
    ]


def _lengths(lengths: dict[str, float]) -> str:
    if not lengths:
        return "—"
    return " / ".join(f"{lengths[key]:.0f}" for key in ("mean", "p50", "p90", "max"))


def _pair(first: float | None, second: float | None) -> str:
    return "—" if first is None or second is None else f"{first:.2f} / {second:.2f}"


CLAIM_HEADERS = (
    "run",
    "ESS mean",
    "ESS min",
    "lag max",
    "lag, first / last quarter of positions",
    "sequences with 2+ versions",
)


def claim_rows(claims: dict[str, dict[str, Any]]) -> list[list[Any]]:
    """``bench figures``' table: one row per run of ``claim_numbers``."""
    return [
        [
            name,
            numbers["ess_mean"],
            numbers["ess_min"],
            numbers["lag_max"],
            _pair(numbers["lag_early"], numbers["lag_late"]),
            numbers["multi_version_fraction"],
        ]
        for name, numbers in claims.items()
    ]
