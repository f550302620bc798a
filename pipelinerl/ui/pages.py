"""The dashboard's HTML pages: runs, one run (live), compare, plan. Each page is a Jinja2 template
that the browser fills from the JSON API (``static/dashboard.js``), refreshing every few seconds (the
Plan page once, and again after its form made a plan).

The server checks only what makes a page meaningful: an unknown run or experiment is a 404 page
that says so; an unreachable database still serves the page, whose banner names the database
while the script keeps retrying.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from pipelinerl.plan.cluster import CLUSTER_FORM
from pipelinerl.plan.lengths import LENGTH_FORMS
from pipelinerl.plan.predict import PLAN_MODES, SWEEP_FORM
from pipelinerl.plan.profile import shipped_profiles
from pipelinerl.platform.tracking.db import PlatformDatabaseError
from pipelinerl.ui import plans
from pipelinerl.ui.api import ID_PATTERN, dashboard
from pipelinerl.ui.queries import RunNotFound
from pipelinerl.ui.service import COMPARE_KINDS

TEMPLATES = Jinja2Templates(directory=str(Path(__file__).parent / "templates"))
router = APIRouter()


def _page(request: Request, template: str, status_code: int = 200, **context: Any) -> HTMLResponse:
    settings = request.app.state.settings
    return TEMPLATES.TemplateResponse(
        request,
        template,
        {"poll_interval_ms": int(settings.poll_interval_s * 1000), **context},
        status_code=status_code,
    )


def _not_found(request: Request, message: str) -> HTMLResponse:
    return _page(request, "not_found.html", status_code=404, message=message)


@router.get("/", response_class=HTMLResponse, include_in_schema=False)
def runs_page(request: Request, experiment: Annotated[str | None, Query(max_length=200)] = None) -> Response:
    if experiment is not None:
        try:
            known = dashboard(request).database.experiments()
        except PlatformDatabaseError:
            known = None  # the page's banner says why; the list fills in once the database answers
        if known is not None and experiment not in known:
            return _not_found(request, f"no experiment {experiment!r} in the platform database")
    return _page(request, "runs.html")


@router.get("/runs/{run_id}", response_class=HTMLResponse, include_in_schema=False)
def run_page(request: Request, run_id: str) -> Response:
    if not re.match(ID_PATTERN, run_id):
        return _not_found(request, f"no run {run_id!r} in the platform database")
    try:
        row = dashboard(request).database.run(run_id)
    except RunNotFound as error:
        return _not_found(request, str(error.args[0]))
    except PlatformDatabaseError:
        return _page(request, "run.html", run_id=run_id)
    if row.mode in COMPARE_KINDS:
        return RedirectResponse(f"/compare?run={run_id}", status_code=303)
    return _page(request, "run.html", run_id=run_id)


@router.get("/compare", response_class=HTMLResponse, include_in_schema=False)
def compare_page(request: Request, run: Annotated[list[str] | None, Query()] = None) -> Response:
    if not run:
        return _page(request, "compare.html", run_ids=[], title="compare")
    for run_id in run:
        if not re.match(ID_PATTERN, run_id):
            return _not_found(request, f"no run {run_id!r} in the platform database")
        try:
            dashboard(request).database.run(run_id)
        except RunNotFound as error:
            return _not_found(request, str(error.args[0]))
        except PlatformDatabaseError:
            break
    return _page(request, "compare.html", run_ids=run, title="compare " + ", ".join(run))


@router.get("/plan", response_class=HTMLResponse, include_in_schema=False)
def plan_page(request: Request, name: Annotated[str | None, Query(max_length=200)] = None) -> Response:
    """The saved plans and the one chosen (default: the newest), and the form that makes a new one."""
    home = request.app.state.settings.plans_home
    if name is not None:
        try:
            if home is None:
                raise plans.PlanNotFound(f"no plan {name!r}: {plans.NO_HOME}")
            plans.read_plan(home, name)
        except plans.PlanNotFound as error:
            return _not_found(request, str(error))
        except plans.PlanUnreadable:
            pass  # the page says why, as for the list
    return _page(
        request,
        "plan.html",
        selected=name,
        plans_dir=None if home is None else str(plans.plans_dir(home)),
        profiles=list(shipped_profiles()),
        modes=PLAN_MODES,
        form={
            "profile": plans.DEFAULT_PROFILE,
            "cluster": plans.DEFAULT_CLUSTER,
            "lengths": plans.DEFAULT_LENGTHS,
            "sweep_example": plans.DEFAULT_SWEEP_EXAMPLE,
            "modes": plans.DEFAULT_MODES,
            "settings": "\n".join(plans.DEFAULT_SETTINGS),
            "prompt_tokens": plans.DEFAULT_PROMPT_TOKENS,
        },
        forms={"cluster": CLUSTER_FORM, "lengths": LENGTH_FORMS, "sweep": SWEEP_FORM},
        limits={
            "steps": plans.MAX_PLAN_STEPS,
            "sweep_values": plans.MAX_SWEEP_VALUES,
            "gpus": plans.MAX_CLUSTER_GPUS,
            "samples": plans.MAX_SIMULATED_SAMPLES,
        },
    )
