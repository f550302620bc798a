"""The figure of a sweep: samples/s and the idle shares against the swept value, one line per mode.

Pure: sweep points in, a matplotlib ``Figure`` out (Agg backend; the caller saves it).
"""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

from matplotlib.figure import Figure  # noqa: E402

from pipelinerl.plan.predict import SweepPoint  # noqa: E402


def sweep_figure(
    points: list[SweepPoint], name: str, best: SweepPoint | None = None, title: str = ""
) -> Figure:
    """Top: predicted samples/s per mode against ``name``'s value (the recommended value marked).
    Bottom: the actors' (solid) and the trainer's (dashed) idle shares, same colours."""
    figure = Figure(figsize=(7.5, 6.0), layout="constrained")
    speed, idle = figure.subplots(2, 1, sharex=True)
    values = [point.value for point in points]
    modes = list(points[0].runs) if points else []
    for index, mode in enumerate(modes):
        colour = f"C{index}"
        speed.plot(values, [p.runs[mode].samples_per_s for p in points], "o-", color=colour, label=mode)
        idle.plot(
            values, [p.runs[mode].actor_idle for p in points], "o-", color=colour, label=f"{mode}: actors"
        )
        idle.plot(
            values, [p.runs[mode].trainer_idle for p in points], "s--", color=colour, label=f"{mode}: trainer"
        )
    if best is not None:
        speed.axvline(best.value, color="grey", linestyle=":", label=f"recommended: {best.value}")
    speed.set_ylabel("samples/s (predicted)")
    speed.legend(fontsize="small")
    speed.grid(alpha=0.3)
    idle.set_ylabel("idle share")
    idle.set_ylim(-0.02, 1.02)
    idle.set_xlabel(name)
    idle.legend(fontsize="small", ncol=2)
    idle.grid(alpha=0.3)
    if title:
        figure.suptitle(title, fontsize="medium")
    return figure
