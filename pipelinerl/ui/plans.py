"""The Plan page's data: the plans saved under the platform home, and new ones made from the page's form.

A plan is what ``pipelinerl plan`` (and the Prefect ``plan`` flow) predict before a run: its samples/s,
idle shares and lag in each mode, or across a sweep of one setting with the best value recommended
(``pipelinerl/plan/report.py``). They are JSON files under ``<home>/plans/``, named
``<created>-<name>.json``; a plan is known here by its file's stem.

``make_plan_from_form`` runs the simulator for the page's form (``PlanRequest``) and saves the result
beside the others. It is the one thing the dashboard writes, so it checks its input before simulating:
a shipped profile only (the form never names files on the server), no ``run:`` lengths, and a size the
dashboard can simulate in a request (``MAX_PLAN_STEPS``, ``MAX_SWEEP_VALUES``, ``MAX_CLUSTER_GPUS``,
``MAX_SIMULATED_SAMPLES``). Bad input raises ``ValueError`` (or its subclasses: ``ConfigError``,
``ProfileError``, ``ClusterError``) naming the value.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipelinerl.plan.cluster import parse_cluster
from pipelinerl.plan.lengths import parse_lengths
from pipelinerl.plan.predict import PLAN_MODES, SWEEP_FORM, parse_sweep
from pipelinerl.plan.profile import ProfileError, shipped_profiles
from pipelinerl.plan.report import PLANS_DIR, make_plan, save_plan, saved_plans
from pipelinerl.platform.config import PipelineConfig, load_config, with_overrides

# A saved plan's file stem (``20260101-120000-sweep``): never a path, never "..".
PLAN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,127}$"
SAVE_NAME_PATTERN = r"^[a-z0-9][a-z0-9\-]{0,39}$"

# What the dashboard simulates in one request (``pipelinerl plan`` has no such limits).
MAX_PLAN_STEPS = 2000  # run.max_steps
MAX_SWEEP_VALUES = 64
MAX_CLUSTER_GPUS = 1024  # the simulation's time grows with the engines as with the samples
MAX_SIMULATED_SAMPLES = 5_000_000  # rl.batch_size x run.max_steps, summed over the values and modes
MAX_LISTED = 200  # the newest plans listed

# The form's defaults (the Prefect ``plan`` flow's, on a run of the size the paper describes).
DEFAULT_PROFILE = "h100-7b"
DEFAULT_CLUSTER = "actors=48xH100,trainers=80xH100"
DEFAULT_LENGTHS = "loglogistic:1200,3500"
DEFAULT_SWEEP_EXAMPLE = "actor_gpus=32..96:16"
DEFAULT_MODES = ("pipeline", "colocated")
DEFAULT_SETTINGS = (
    "rl.batch_size=1024",
    "rl.group_size=8",
    "actor.max_in_flight=64",
    "actor.max_new_tokens=8192",
    "run.steps_per_round=32",
    "run.max_steps=100",
)
DEFAULT_PROMPT_TOKENS = 300
_RANGE = re.compile(r"^(-?\d+)\.\.(-?\d+)(?::(\d+))?$")  # as predict.parse_sweep reads a range


class PlanNotFound(LookupError):
    """No saved plan of that name; the message names it."""


class PlanUnreadable(ValueError):
    """A saved plan's file that is not a plan (not JSON, not an object); the message names it."""


class PlanRequest(BaseModel):
    """The Plan page's form (``POST /api/plan``): what ``pipelinerl plan`` takes, settings one per line."""

    model_config = ConfigDict(extra="forbid")

    profile: str = Field(DEFAULT_PROFILE, min_length=1, max_length=200, description="a shipped profile")
    cluster: str | None = Field(
        DEFAULT_CLUSTER, max_length=200, description="actors=<N>x<GPU>,trainers=<N>x<GPU>; empty: none"
    )
    lengths: str = Field(DEFAULT_LENGTHS, min_length=1, max_length=200)
    sweep: str | None = Field(None, max_length=500, description=f"{SWEEP_FORM}; empty: no sweep")
    modes: list[str] = Field(default_factory=lambda: list(DEFAULT_MODES), min_length=1, max_length=8)
    settings: list[str] = Field(
        default_factory=lambda: list(DEFAULT_SETTINGS),
        max_length=200,
        description="section.key=value, applied over the default configuration",
    )
    prompt_tokens: int = Field(DEFAULT_PROMPT_TOKENS, ge=0, le=1_000_000)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    name: str | None = Field(
        None, pattern=SAVE_NAME_PATTERN, description="saved as <created>-<name>; default sweep or plan"
    )

    @field_validator("settings", mode="before")
    @classmethod
    def _lines(cls, value: Any) -> Any:
        """A textarea's text as its lines; blank lines and ``#`` comments left out."""
        lines = value.splitlines() if isinstance(value, str) else value
        if isinstance(lines, list):
            return [
                line.strip()
                for line in lines
                if not isinstance(line, str) or (line.strip() and not line.strip().startswith("#"))
            ]
        return value

    @field_validator("cluster", "sweep", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        return None if isinstance(value, str) and not value.strip() else value


def check_plan_name(name: str) -> None:
    if not re.match(PLAN_NAME_PATTERN, name):
        raise PlanNotFound(f"no plan {name!r}: a plan is named by its file's stem (letters, digits, - and _)")


def plans_dir(home: Path) -> Path:
    return home.expanduser() / PLANS_DIR


def plan_paths(home: Path) -> list[Path]:
    """The saved plans, newest first (two saved in one second: the later written first)."""

    def written(path: Path) -> int:
        try:
            return path.stat().st_mtime_ns
        except OSError:
            return 0

    return sorted(saved_plans(home), key=lambda path: (path.name[:15], written(path)), reverse=True)


def read_plan(home: Path, name: str) -> dict[str, Any]:
    """The saved plan ``name`` (its file's stem); ``PlanNotFound`` / ``PlanUnreadable`` naming it."""
    check_plan_name(name)
    directory = plans_dir(home)
    path = directory / f"{name}.json"
    if path.parent != directory or not path.is_file():
        raise PlanNotFound(f"no plan {name!r} under {directory}")
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise PlanUnreadable(f"plan {name!r} under {directory} cannot be read: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("asked"), dict):
        raise PlanUnreadable(f"plan {name!r} under {directory} is not a plan (no 'asked' object)")
    return data


def created_iso(created: Any) -> str | None:
    """``20260101-120000`` (UTC, as ``save_plan`` writes it) as ISO 8601; None if it is not that."""
    try:
        return datetime.strptime(str(created), "%Y%m%d-%H%M%S").replace(tzinfo=UTC).isoformat()
    except ValueError:
        return None


def summary(name: str, data: dict[str, Any]) -> dict[str, Any]:
    """One row of the list of plans."""
    asked = data.get("asked") or {}
    return {
        "name": name,
        "created": created_iso(data.get("created")),
        "kind": "sweep" if "points" in data else "plan",
        "profile": asked.get("profile"),
        "cluster": asked.get("cluster"),
        "lengths": asked.get("lengths"),
        "modes": asked.get("modes") or [],
        "sweep": asked.get("sweep"),
        "swept": data.get("swept"),
        "recommended": data.get("recommended"),
    }


def list_plans(home: Path | None) -> dict[str, Any]:
    """The newest ``MAX_LISTED`` plans, each summarised; a file that is not a plan is named in
    ``warnings`` and left out."""
    if home is None:
        return {"home": None, "plans": [], "warnings": [NO_HOME]}
    plans, warnings = [], []
    for path in plan_paths(home)[:MAX_LISTED]:
        try:
            plans.append(summary(path.stem, read_plan(home, path.stem)))
        except (PlanNotFound, PlanUnreadable) as error:
            warnings.append(str(error))
    return {"home": str(plans_dir(home)), "plans": plans, "warnings": warnings}


NO_HOME = (
    "the dashboard was started without a platform home (UiSettings.plans_home): no plans to read or "
    "save; pipelinerl ui reads it from run.home"
)


def make_plan_from_form(form: PlanRequest, home: Path) -> tuple[str, dict[str, Any]]:
    """Simulate the form's plan and save it under ``home``; returns its name and its data as saved."""
    shipped = shipped_profiles()
    if form.profile not in shipped:
        raise ProfileError(
            f"profile {form.profile!r}: not a shipped profile; the dashboard plans with one of "
            f"{', '.join(shipped) or '(none)'} (pipelinerl plan takes a profile file)"
        )
    modes = list(dict.fromkeys(mode.strip() for mode in form.modes))
    unknown = [mode for mode in modes if mode not in PLAN_MODES]
    if unknown:
        raise ValueError(f"mode {', '.join(unknown)}: the modes planned are {', '.join(PLAN_MODES)}")
    config = load_config(None, form.settings)
    if form.lengths.startswith("run:"):
        raise ValueError(
            f"lengths {form.lengths!r}: a finished run's lengths are read by pipelinerl plan, not the "
            "dashboard; give fixed:, lognormal: or loglogistic:"
        )
    lengths = parse_lengths(form.lengths, config.actor.max_new_tokens)
    check_size(config, form.cluster, form.sweep, len(modes))
    made = make_plan(
        config,
        form.profile,
        lengths,
        form.lengths,
        modes,
        form.prompt_tokens,
        form.cluster,
        form.sweep,
        form.seed,
    )
    path = save_plan(home, made.to_json(), name=form.name or ("sweep" if made.best else "plan"))
    return path.stem, json.loads(path.read_text())


def check_size(config: PipelineConfig, cluster: str | None, sweep: str | None, modes: int) -> None:
    """``ValueError`` naming the limit when the plan is more than the dashboard simulates in a request."""
    per_value = [config]
    if sweep is not None:
        _, _, values = sweep.replace(" ", "").partition("=")
        match = _RANGE.match(values)
        if match:  # counted before parse_sweep lists them
            low, high, step = int(match.group(1)), int(match.group(2)), int(match.group(3) or 1)
            count = (high - low) // step + 1 if step >= 1 and high >= low else 0
        else:
            count = len(values.split(","))
        if count > MAX_SWEEP_VALUES:
            raise ValueError(
                f"sweep {sweep!r}: {count} values; the dashboard sweeps at most {MAX_SWEEP_VALUES} "
                "(pipelinerl plan --sweep takes more)"
            )
        axis = parse_sweep(sweep)
        if axis.name != "actor_gpus":
            per_value = [with_overrides(config, {axis.name: value}) for value in axis.values]
        else:
            per_value = [config] * len(axis.values)
    for each in per_value:
        if each.run.max_steps > MAX_PLAN_STEPS:
            raise ValueError(
                f"run.max_steps={each.run.max_steps}: the dashboard simulates at most {MAX_PLAN_STEPS} "
                "steps (pipelinerl plan takes more)"
            )
    if cluster is not None:
        planned = parse_cluster(cluster)
        if planned.total > MAX_CLUSTER_GPUS:
            raise ValueError(
                f"cluster {cluster!r}: {planned.total} GPUs; the dashboard plans at most "
                f"{MAX_CLUSTER_GPUS} (pipelinerl plan takes more)"
            )
    elif config.actor.num_actors > MAX_CLUSTER_GPUS:
        raise ValueError(
            f"actor.num_actors={config.actor.num_actors}: the dashboard plans at most {MAX_CLUSTER_GPUS} "
            "engines"
        )
    samples = sum(each.rl.batch_size * each.run.max_steps for each in per_value) * modes
    if samples > MAX_SIMULATED_SAMPLES:
        raise ValueError(
            f"the plan simulates {samples:,} samples (rl.batch_size x run.max_steps, over "
            f"{len(per_value)} value(s) and {modes} mode(s)); the dashboard simulates at most "
            f"{MAX_SIMULATED_SAMPLES:,} in a request: fewer steps, values or modes, or pipelinerl plan"
        )
