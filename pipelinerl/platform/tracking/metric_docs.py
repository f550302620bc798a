"""The metric registry as ``docs/metrics.md`` shows it: every declared name, and the old names it replaced."""

from __future__ import annotations

from pipelinerl.platform.tracking.metric_registry import (
    METRICS,
    MLFLOW_ALIAS_PATTERNS,
    MLFLOW_ALIASES,
    RECORD_ALIASES,
    RECORD_FILES,
)


def markdown_table() -> str:
    """The registry as docs/metrics.md shows it (a unit test keeps the page equal to this)."""
    lines = ["| name | owner | unit | where | description |", "|---|---|---|---|---|"]
    for m in METRICS:
        where = [f"`{RECORD_FILES[r]}`" for r in sorted(m.records)] + (["MLflow"] if m.mlflow else [])
        where += [f"`{m.stored}`"] if m.stored else []
        if m.derive is not None:
            where.append("derived from " + ", ".join(f"`{key}`" for key in m.inputs))
        description = m.description.replace("|", "\\|")
        lines.append(f"| `{m.name}` | {m.owner} | {m.unit} | {', '.join(where)} | {description} |")
    aliases = ["| old name | new name | where |", "|---|---|---|"]
    aliases += [f"| `{old}` | `{new}` | `metrics.jsonl` |" for old, new in RECORD_ALIASES["trainer"].items()]
    aliases += [f"| `{old}` | `{new}` | MLflow |" for old, new in MLFLOW_ALIASES.items()]
    aliases += [f"| `{old}` | `{new}` | MLflow |" for old, new in MLFLOW_ALIAS_PATTERNS]
    return "\n".join(lines) + "\n\n" + "\n".join(aliases) + "\n"
