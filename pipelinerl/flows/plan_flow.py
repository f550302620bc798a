"""The ``plan`` flow: ``pipelinerl plan`` from Prefect's typed form; its result is a table artifact, a
markdown artifact with the recommendation and the figure's path, and the plan saved under the platform
home, where the dashboard's Plan page draws it."""

from __future__ import annotations

from typing import Annotated, Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from pydantic import Field

from pipelinerl.plan.calibrate import lengths_from
from pipelinerl.plan.figures import sweep_figure
from pipelinerl.plan.lengths import LENGTH_FORMS
from pipelinerl.plan.predict import PlanMode
from pipelinerl.plan.report import Plan, make_plan, save_plan, speedups
from pipelinerl.platform.config import PipelineConfig


@flow(name="plan", log_prints=True)
def plan(
    config: PipelineConfig = PipelineConfig(),  # noqa: B008 (the form's default)
    profile: Annotated[
        str, Field(description="A shipped cost profile's name (pipelinerl plan profiles) or a profile file.")
    ] = "h100-7b",
    lengths: Annotated[
        str, Field(description=f"Completion lengths: {LENGTH_FORMS}.")
    ] = "loglogistic:1200,3500",
    cluster: Annotated[
        str | None, Field(description="e.g. actors=48xH100,trainers=80xH100; empty: the config's own actors.")
    ] = "actors=48xH100,trainers=80xH100",
    sweep: Annotated[
        str | None,
        Field(
            description="One setting varied: actor_gpus=LOW..HIGH:STEP or SECTION.NAME=V1,V2,...; empty: none"
        ),
    ] = None,
    modes: Annotated[
        list[PlanMode],
        Field(min_length=1, description="Modes to predict; a sweep recommends the value best for the first."),
    ] = ["pipeline", "colocated"],  # noqa: B006 (the form's default)
    prompt_tokens: Annotated[int, Field(ge=0, description="Tokens per prompt.")] = 300,
    seed: int = 0,
) -> dict[str, Any]:
    """Predict the configuration's run (speed, idle shares, lag) on a cluster before launching it.

    Args:
        config: The experiment to plan (its batch, G, H, max_lag, steps...).
        profile: The cost profile the simulation runs on.
        lengths: The completion lengths the actors write.
        cluster: The GPUs that act and train; with a GPU profile.
        sweep: A setting to vary, with the value of the most samples/s recommended.
        modes: Modes simulated; the first is the one the recommendation is for.
        prompt_tokens: Prompt length, in tokens.
        seed: Seed of the drawn lengths.
    """
    logger = get_run_logger()
    drawn = lengths_from(lengths, config.actor.max_new_tokens)
    made = make_plan(
        config,
        profile,
        drawn,
        lengths,
        list(modes),
        prompt_tokens,
        cluster or None,
        sweep or None,
        seed,
        on_point=lambda point: logger.info("%s=%s predicted", sweep, point.value),
    )
    saved = save_plan(config.run.home, made.to_json(), name="sweep" if made.best else "plan")
    create_table_artifact(key="plan-table", table=table_rows(made), description=described(made))
    markdown = f"## Plan\n\n{described(made)}\n\nSaved to `{saved}` (the dashboard's Plan page draws it)."
    if made.best is not None:
        figure = saved.with_suffix(".png")
        sweep_figure(made.points, made.swept or "", made.best, f"{made.asked['profile']}").savefig(
            figure, dpi=110
        )
        markdown += f"\n\nFigure: `{figure}`"
    create_markdown_artifact(key="plan-summary", markdown=markdown, description="What the plan recommends")
    logger.info("%s", described(made))
    return made.to_json()


def described(made: Plan) -> str:
    asked = made.asked
    where = f" on {asked['cluster']}" if asked["cluster"] else ""
    if made.best is not None:
        return f"Profile {asked['profile']}{where}, lengths {asked['lengths']}. Recommended: {made.reason}."
    first = next(iter(made.runs))
    ratios = "; ".join(
        f"{first} / {other}: {ratio:.2f}x samples/s" for other, ratio in speedups(made.runs).items()
    )
    return f"Profile {asked['profile']}{where}, lengths {asked['lengths']}. {ratios or ''}".strip()


def table_rows(made: Plan) -> list[dict[str, Any]]:
    """One row per mode (a plan), or per swept value and mode (a sweep)."""
    points = made.points or []
    cases = [(point.value, point.runs) for point in points] if points else [(None, made.runs)]
    rows = []
    for value, runs in cases:
        for mode, run in runs.items():
            row: dict[str, Any] = {} if value is None else {made.swept or "value": value}
            rows.append(
                row
                | {
                    "mode": mode,
                    "samples/s": round(run.samples_per_s, 3),
                    "seconds": round(run.seconds, 1),
                    "actor idle": round(run.actor_idle, 3),
                    "trainer idle": round(run.trainer_idle, 3),
                    "lag mean": round(run.lag_mean, 2),
                    "lag max": run.lag_max,
                }
            )
    return rows
