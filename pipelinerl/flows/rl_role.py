"""The ``rl-role`` Prefect flow: one node's share of one role of a run, on a worker of the role's pool.

``rl-run`` with ``cluster.placement = "pools"`` submits one flow run of this flow per role and node
(``flows/placement.py``): ``rl-role/trainers`` on the ``trainers`` pool runs trainer ranks (node 0
also the preprocessor), ``rl-role/actors`` on the ``actors`` pool runs actors. The flow reads the
run's ``config.json`` from the shared run directory, starts its stages (``launch/stages.py``),
streams their logs into its own flow run, and completes when they are done. A crashed stage fails
the flow run with the stage's log tail, which ``rl-run`` reports (and may restart from); cancelling
the flow run stops its processes. While its stages run it writes a heartbeat to the run directory
(``flows/role_heartbeat.py``), by which ``rl-run`` tells a lost host, and looks there for a request
to stop (``flows/role_stop.py``): then it stops its stages and ends ``Cancelled`` with the reason.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from prefect import flow, get_run_logger
from prefect.runtime import flow_run
from prefect.states import Cancelled, State
from pydantic import Field

from pipelinerl.flows.rl_run import StageLogForwarder
from pipelinerl.flows.role_heartbeat import beating, heartbeat_path
from pipelinerl.flows.role_stop import stop_request_path, stop_requested
from pipelinerl.launch.stages import assignment, run_role
from pipelinerl.platform.config import PipelineConfig, Role


@flow(name="rl-role", log_prints=True)
def rl_role(
    run_dir: Annotated[str, Field(description="The run directory (shared by every node), with config.json.")],
    role: Annotated[
        Role, Field(description="trainer: trainer ranks (+ preprocessor on node 0); actor: actors.")
    ],
    model_path: Annotated[str, Field(description="The model directory the stages start from.")],
    node: Annotated[
        int, Field(ge=0, description="Which of the role's cluster.<role>_nodes nodes this is.")
    ] = 0,
) -> dict[str, object] | State:
    """Run one node's share of one role of a PipelineRL run until the run is done."""
    logger = get_run_logger()
    directory = Path(run_dir)
    config = PipelineConfig.model_validate_json((directory / "config.json").read_text())
    share = assignment(config, role, node)
    names = share.stage_names()
    stop_path = stop_request_path(directory, flow_run.id) if flow_run.id else None
    # A flow run that a worker picked up only after its attempt was stopped.
    if stop_path is not None and (late := stop_requested(stop_path)) is not None:
        return Cancelled(message=f"stopped by the run before it started: {late}")
    with beating(heartbeat_path(directory, role, node)) as host:
        logger.info("%s node %d of run %s on host %s: %s", role, node, directory.name, host, ", ".join(names))
        with StageLogForwarder(directory / "logs", logger, names=set(names)):
            stopped = run_role(
                directory,
                role,
                node,
                Path(model_path),
                stop_requested=lambda: None if stop_path is None else stop_requested(stop_path),
            )
    if stopped is not None:
        logger.info("stopped its stages: %s", stopped)
        return Cancelled(message=f"stopped by the run: {stopped}")
    return {"run_id": directory.name, "role": role, "node": node, "host": host, "stages": names}
