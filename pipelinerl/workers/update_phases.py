"""An update pause taken apart: the phases an actor records beside the pause (``actor<k>.jsonl``).

The engines time their pause (``Engine.last_update_s``: ``pause``, until the engine stopped between
two steps; ``load``; ``label_resume``, stamping the versions and resuming). Where the tensors arrive
inside the pause (the vllm engine in pipeline and conventional modes), the engine's ``load`` holds
the receiving too, and it is split out here, so the phases always add up to the pause. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping

from pipelinerl.platform.tracking import metric_registry as registry


def update_phases(
    engine_phases: Mapping[str, float], received_s: float, *, received_in_pause: bool
) -> dict[str, float]:
    """The record's fields, ms: every phase of the pause (``weights/update_phase_ms/<phase>``) and
    the receiving (``weights/receive_ms``), inside the pause or before it."""
    phases = dict(engine_phases)
    if received_in_pause and "load" in phases:
        phases["receive"] = min(received_s, phases["load"])
        phases["load"] -= phases["receive"]
    fields = {registry.UPDATE_PHASE_MS.format(phase=name): 1000 * seconds for name, seconds in phases.items()}
    fields[registry.WEIGHTS_RECEIVE_MS] = 1000 * received_s
    return fields
