"""The dashboard's JSON API (``/api/...``), which the pages read and scripts may too.

Every endpoint is read-only but ``POST /api/plan``, which simulates a plan and saves it under the
platform home (``plans.py``). Query parameters are validated (a bad one is a 422 naming it); an
unknown run is a 404 with ``{"detail": "no run ... in the platform database"}``; an unreachable
platform database is a 503 whose ``detail`` names it; a plan that cannot be made is a 400 whose
``detail`` names the bad value. ``docs/ui.md`` lists the endpoints with
examples; ``/openapi.json`` has their schemas.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Body, HTTPException, Query, Request
from pydantic import ValidationError

from pipelinerl.platform.tracking import metric_registry as registry
from pipelinerl.platform.tracking.db import PlatformDatabaseError
from pipelinerl.ui.plans import (
    NO_HOME,
    PlanNotFound,
    PlanRequest,
    PlanUnreadable,
    list_plans,
    make_plan_from_form,
    read_plan,
)
from pipelinerl.ui.queries import NotFound, RunFilter
from pipelinerl.ui.sampling import DEFAULT_MAX_POINTS, MAX_MAX_POINTS, MIN_MAX_POINTS
from pipelinerl.ui.service import Dashboard

router = APIRouter(prefix="/api")

# A run id or experiment name as the platform writes them (letters, digits, -_.:), never a path.
ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:\-]{0,127}$"
NAME_PATTERN = r"^[^\x00-\x1f]{1,200}$"
MAX_RUNS = 1000
MAX_HEATMAP_STEPS = 2000
DEFAULT_HEATMAP_STEPS = 200

RunId = Annotated[str, Query(pattern=ID_PATTERN, description="a run id")]
MaxPoints = Annotated[
    int,
    Query(
        ge=MIN_MAX_POINTS,
        le=MAX_MAX_POINTS,
        description="most points per series; longer series are downsampled keeping each bucket's extremes",
    ),
]


def dashboard(request: Request) -> Dashboard:
    return request.app.state.dashboard  # type: ignore[no-any-return]


@contextmanager
def _errors() -> Iterator[None]:
    """Unknown runs and experiments are 404s, an unusable database a 503; each ``detail`` is one line."""
    try:
        yield
    except NotFound as error:
        raise HTTPException(status_code=404, detail=str(error.args[0])) from None
    except PlatformDatabaseError as error:
        raise HTTPException(status_code=503, detail=str(error)) from None


def _answer(read: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    with _errors():
        return read()


def _check_run_id(run_id: str) -> None:
    if not re.match(ID_PATTERN, run_id):
        raise HTTPException(status_code=404, detail=f"no run {run_id!r} in the platform database")


@router.get("/health", summary="Whether the platform database answers (the pages poll this)")
def health(request: Request) -> dict[str, Any]:
    return dashboard(request).health()


@router.get("/metrics", summary="Every metric a run writes or shows, with owner, unit and meaning")
def metrics() -> dict[str, Any]:
    """The metric registry (``platform/tracking/metric_registry.py``), and the old names of renamed
    metrics: the names, units and labels the pages print come from here."""
    return {
        "metrics": [
            {
                "name": m.name,
                "owner": m.owner,
                "unit": m.unit,
                "description": m.description,
                "kind": m.kind,
                "pattern": m.is_pattern,
                "records": sorted(m.records),
                "mlflow": m.mlflow,
                "stored": m.stored,
                "api": m.api or m.column,
                "inputs": list(m.inputs),
            }
            for m in registry.METRICS
        ],
        "aliases": {
            "trainer_records": registry.RECORD_ALIASES["trainer"],
            "mlflow": {**registry.MLFLOW_ALIASES, **dict(registry.MLFLOW_ALIAS_PATTERNS)},
        },
    }


@router.get("/runs", summary="Runs, newest first, with status, heartbeat, version, reward, eval, ESS, lag")
def runs(
    request: Request,
    experiment: Annotated[
        str | None, Query(pattern=NAME_PATTERN, description="experiment (run.name)")
    ] = None,
    mode: Annotated[str | None, Query(pattern=ID_PATTERN, description="pipeline, conventional, ...")] = None,
    status: Annotated[Literal["running", "finished", "failed", "killed"] | None, Query()] = None,
    parent: Annotated[str | None, Query(pattern=ID_PATTERN, description="only children of this run")] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_RUNS)] = 100,
) -> dict[str, Any]:
    run_filter = RunFilter(experiment=experiment, mode=mode, status=status, parent_run_id=parent, limit=limit)
    return _answer(lambda: dashboard(request).runs(run_filter))


@router.get("/runs/{run_id}", summary="One run: fields, links, summary, config, children")
def run(request: Request, run_id: str) -> dict[str, Any]:
    _check_run_id(run_id)
    return _answer(lambda: dashboard(request).run(run_id))


@router.get(
    "/runs/{run_id}/steps", summary="Per-step series (reward, ESS, lag, ...) by version, time, samples"
)
def steps(request: Request, run_id: str, max_points: MaxPoints = DEFAULT_MAX_POINTS) -> dict[str, Any]:
    _check_run_id(run_id)
    return _answer(lambda: dashboard(request).steps(run_id, max_points))


@router.get("/runs/{run_id}/lag-histogram", summary="Token lag histogram of one step (default: the newest)")
def lag_histogram(
    request: Request,
    run_id: str,
    version: Annotated[int | None, Query(ge=0, description="policy version of the step")] = None,
) -> dict[str, Any]:
    _check_run_id(run_id)
    return _answer(lambda: dashboard(request).lag_histogram(run_id, version))


@router.get("/runs/{run_id}/lag-by-position", summary="Mean lag by token position and step (heat map)")
def lag_by_position(
    request: Request,
    run_id: str,
    max_steps: Annotated[int, Query(ge=2, le=MAX_HEATMAP_STEPS)] = DEFAULT_HEATMAP_STEPS,
) -> dict[str, Any]:
    _check_run_id(run_id)
    return _answer(lambda: dashboard(request).lag_by_position(run_id, max_steps))


@router.get("/runs/{run_id}/live", summary="Stages, evals, update pauses, multi-version sequences, restarts")
def live(request: Request, run_id: str, max_points: MaxPoints = DEFAULT_MAX_POINTS) -> dict[str, Any]:
    _check_run_id(run_id)
    return _answer(lambda: dashboard(request).live(run_id, max_points))


@router.get(
    "/compare", summary="Runs overlaid, with the time-to-target table (a compare parent: its children)"
)
def compare(
    request: Request,
    run: Annotated[list[str], Query(description="run ids (repeat), or one compare/sweep parent")],
    max_points: MaxPoints = DEFAULT_MAX_POINTS,
    target: Annotated[
        float | None, Query(description="target train reward (default: the highest all reached)")
    ] = None,
) -> dict[str, Any]:
    if not 1 <= len(run) <= 20:
        raise HTTPException(status_code=422, detail=f"give 1 to 20 run ids, got {len(run)}")
    for run_id in run:
        _check_run_id(run_id)
    return _answer(lambda: dashboard(request).compare(run, max_points, target))


# ----- plans (pipelinerl plan's predictions, saved under the platform home) -----


def _plans_home(request: Request) -> Path | None:
    return request.app.state.settings.plans_home  # type: ignore[no-any-return]


@router.get("/plans", summary="The plans saved under the platform home, newest first")
def plans(request: Request) -> dict[str, Any]:
    return list_plans(_plans_home(request))


@router.get("/plans/{name}", summary="One saved plan (by its file's stem), as pipelinerl plan --json")
def plan(request: Request, name: str) -> dict[str, Any]:
    home = _plans_home(request)
    if home is None:
        raise HTTPException(status_code=404, detail=f"no plan {name!r}: {NO_HOME}")
    try:
        return read_plan(home, name)
    except PlanNotFound as error:
        raise HTTPException(status_code=404, detail=str(error)) from None
    except PlanUnreadable as error:
        raise HTTPException(status_code=422, detail=str(error)) from None


@router.post(
    "/plan",
    summary="Simulate a plan (as pipelinerl plan) and save it under the platform home",
    openapi_extra={
        "requestBody": {"content": {"application/json": {"schema": PlanRequest.model_json_schema()}}}
    },
)
def new_plan(
    request: Request, body: Annotated[dict[str, Any], Body(description="PlanRequest's fields")]
) -> dict[str, Any]:
    """The form's plan, simulated and saved: ``{"name": <file stem>, "plan": <the saved plan>}``. Bad
    input (a profile, cluster, lengths, sweep, mode or setting that cannot be used, or a plan larger
    than the dashboard simulates in a request) is a 400 whose ``detail`` names it."""
    home = _plans_home(request)
    if home is None:
        raise HTTPException(status_code=503, detail=NO_HOME)
    try:
        form = PlanRequest.model_validate(body)
        name, saved = make_plan_from_form(form, home)
    except ValidationError as error:
        raise HTTPException(status_code=400, detail=_form_errors(error)) from None
    except ValueError as error:  # ConfigError, ProfileError, ClusterError, the limits
        raise HTTPException(status_code=400, detail=str(error)) from None
    return {"name": name, "plan": saved}


def _form_errors(error: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'form'}: {problem['msg']}"
        + (f" (got {problem['input']!r})" if problem["type"] != "missing" else "")
        for problem in error.errors()
    )
