"""Pool placement: a run's roles as Prefect flow runs on the ``trainers`` and ``actors`` work pools.

With ``cluster.placement = "pools"`` the launcher (``launch/launcher.py``) starts no process
itself. For each role and node it submits one flow run of the role's deployment
(``cluster.trainer_deployment`` / ``cluster.actor_deployment``, the ``rl-role`` flow), so a worker
of that pool (a GPU node, a Kubernetes job, a process on this machine) runs the node's stages from
the shared run directory. The launcher then supervises those flow runs as it would processes:

* the run is done when every trainer flow run has completed;
* a role flow run that fails, crashes or is cancelled raises ``StageFailed`` with its state message
  (which carries the stage's log tail), and ``run.max_restarts`` applies as for local stages; where a
  trainer node's flow run failed (a rank or the preprocessor) and ``run.actors_survive_restart`` is on,
  only the trainer role's flow runs are stopped and submitted again: the actors' flow runs go on,
  keep their engines and take the checkpoint's weights (``platform/rebase.py``);
* a flow run no worker picks up within ``cluster.start_timeout_s`` fails the run, naming the pool;
* a running flow run whose heartbeat (``flows/role_heartbeat.py``) is older than
  ``cluster.heartbeat_timeout_s`` has lost its host: it is marked crashed and the run fails (or
  restarts) naming the host, without waiting for a worker that died with it; when another role fails
  first (the trainer's broadcast to a killed actor resets at once), the launcher waits for the late
  heartbeats to lapse or beat again (``role_heartbeat.attribution``) and names the lost host;
* stopping (a failure, a cancelled ``rl-run``) asks every role flow run still going to stop through
  the run directory (``flows/role_stop.py``; they stop their stages and end cancelled), cancels those
  not yet started, and cancels through Prefect any that still run after ``STOP_WAIT_S``.

Job variables: ``gpus`` (``cluster.<role>_gpus_per_node``) and ``nodes`` (``cluster.<role>_nodes``)
are passed where the pool's base job template declares them (the Kubernetes and Docker templates
under ``job_templates/`` do; a plain process pool does not, and the run says so in its log).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from prefect import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from prefect.deployments import run_deployment
from prefect.states import Cancelling, Crashed

from pipelinerl.flows.role_heartbeat import LATE_S, attribution, heartbeat_path, read_heartbeat
from pipelinerl.flows.role_stop import request_stop, stop_request_path
from pipelinerl.launch.launcher import local_placement
from pipelinerl.launch.stages import SHUTDOWN_GRACE_S, StageFailed
from pipelinerl.platform.config import ROLES, PipelineConfig, Role

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun

# A role flow run asked to stop (``flows/role_stop.py``) stops its stages in seconds (SIGTERM, 5 s,
# SIGKILL); only one still running after this long is cancelled through Prefect as well.
STOP_WAIT_S = 30.0
CANCEL_WAIT_S = 90.0  # a process worker gives a cancelled flow run 30 s before it kills it
# How long the Prefect API may be unreachable (a server restarting, a network blip) before the run
# fails naming it: the stages do not need the API to train, only the supervision does.
API_OUTAGE_S = 300.0
# While a run goes, the role flow runs' states are read at most this often (one request for all of
# them); the launcher's loop turns faster to tail the records. Reading them every turn (0.5 s, one
# request per role) was most of the Prefect server's work during a run.
STATES_EVERY_S = 2.0


@dataclass
class RoleRun:
    role: Role
    node: int
    flow_run_id: UUID
    name: str
    pool: str
    submitted_at: float
    queue: str | None = None


def role_parameters(run_dir: Path, role: Role, node: int, model_path: Path) -> dict[str, Any]:
    return {"run_dir": str(run_dir), "role": role, "node": node, "model_path": str(model_path)}


def job_variables(config: PipelineConfig, role: Role, declared: set[str]) -> dict[str, Any]:
    """The role's GPU and node counts, as far as the pool's job template declares those variables."""
    wanted = {"gpus": config.cluster.gpus_per_node(role), "nodes": config.cluster.nodes(role)}
    return {key: value for key, value in wanted.items() if key in declared}


class PoolPlacement:
    """Runs a run's stages as one Prefect flow run per role and node (see the module docstring)."""

    def __init__(self, run_dir: Path, log: Any = None) -> None:
        self.run_dir = run_dir
        self.log = log or (lambda text: None)
        self.runs: list[RoleRun] = []
        self.start_timeout_s = 0.0
        self.heartbeat_timeout_s = 60.0
        self.peak_rss_bytes = 0  # the stages' memory is on the pools' machines
        self.lost: set[UUID] = set()  # role flow runs whose host was lost (marked crashed)
        self.api_down_since: float | None = None
        self.next_states_at = 0.0  # poll reads the states again from then (monotonic)

    def start(self, config: PipelineConfig, model_path: Path) -> None:
        self.start_timeout_s = config.cluster.start_timeout_s
        self.heartbeat_timeout_s = config.cluster.heartbeat_timeout_s
        self.runs = []
        self.lost = set()
        self._submit(config, model_path, ROLES)

    def _submit(self, config: PipelineConfig, model_path: Path, roles: tuple[Role, ...]) -> None:
        """One flow run of each of ``roles``' deployments per node, added to ``self.runs``."""
        self.next_states_at = 0.0
        for role in roles:  # an earlier attempt's heartbeats would read as this attempt's, gone silent
            for node in range(config.cluster.nodes(role)):
                heartbeat_path(self.run_dir, role, node).unlink(missing_ok=True)
        for role in roles:
            name = config.cluster.deployment(role)
            with get_client(sync_client=True) as client:
                try:
                    deployment = client.read_deployment_by_name(name)
                except Exception as error:  # ObjectNotFound, an unreachable API
                    raise StageFailed(
                        f"cluster.{role}_deployment={name!r} cannot be read from the Prefect API "
                        f"({type(error).__name__}: {error}); register it with `pipelinerl deploy`"
                    ) from None
                pool = deployment.work_pool_name or "(none)"
                declared = self._declared_variables(client, deployment.work_pool_name)
            variables = job_variables(config, role, declared)
            if skipped := {"gpus", "nodes"} - set(variables):
                self.log(f"work pool {pool!r} declares no {', '.join(sorted(skipped))} job variable: not set")
            for node in range(config.cluster.nodes(role)):
                queue = config.cluster.work_queue(role, node)
                flow_run = cast(
                    "FlowRun",
                    run_deployment(
                        name,
                        parameters=role_parameters(self.run_dir, role, node, model_path),
                        job_variables=variables,
                        work_queue_name=queue,
                        timeout=0,
                        flow_run_name=f"{self.run_dir.name}-{role}{node}",
                        tags=["pipelinerl", f"role:{role}"],
                    ),
                )
                submitted = time.monotonic()
                self.runs.append(RoleRun(role, node, flow_run.id, flow_run.name, pool, submitted, queue))
                self.log(
                    f"submitted {role} node {node} as flow run {flow_run.name} ({flow_run.id}) to pool {pool}"
                    + (f", work queue {queue}" if queue else "")
                )

    @staticmethod
    def _declared_variables(client: Any, pool_name: str | None) -> set[str]:
        if not pool_name:
            return set()
        template = client.read_work_pool(pool_name).base_job_template or {}
        return set(template.get("variables", {}).get("properties", {}))

    def _states(self, runs: list[RoleRun] | None = None) -> list[tuple[RoleRun, Any]]:
        """Every role flow run (or those of ``runs``) with its state (None if the API does not list
        it), in one request."""
        runs = self.runs if runs is None else runs
        ids = [run.flow_run_id for run in runs]
        with get_client(sync_client=True) as client:
            listed = client.read_flow_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=ids)), limit=len(ids)
            )
        states = {flow_run.id: flow_run.state for flow_run in listed}
        return [(run, states.get(run.flow_run_id)) for run in runs]

    def host_of(self, run: RoleRun) -> str | None:
        """The host the role flow run last reported from (its heartbeat), if it started."""
        beat = read_heartbeat(heartbeat_path(self.run_dir, run.role, run.node))
        return None if beat is None else beat.host

    def _heartbeat_age(self, run: RoleRun) -> float | None:
        """Seconds since the run's last heartbeat; None if it has written none, or its last one says its
        stages ended (its flow run is reporting its end: its host is not lost)."""
        beat = read_heartbeat(heartbeat_path(self.run_dir, run.role, run.node))
        return None if beat is None or beat.ended else beat.age_s(time.time())

    def _silent_for(self, run: RoleRun) -> float | None:
        """Seconds since the run's last heartbeat, where that is past the timeout; else None."""
        age = self._heartbeat_age(run)
        return age if age is not None and age > self.heartbeat_timeout_s else None

    def _lost_host_behind(self, failed: RoleRun) -> str | None:
        """When ``failed`` has failed: if another running role's host is lost (its heartbeat late,
        then lapsed), mark that flow run crashed and return what ``_mark_lost`` says; None if every
        other running role beats. Waits while a heartbeat is late: at most ``LATE_S`` for one to
        become late, then until the late ones lapse or beat again (the heartbeat timeout)."""
        watch_until = time.monotonic() + LATE_S + self.heartbeat_timeout_s + 5.0
        first_look_until = time.monotonic() + LATE_S
        while time.monotonic() < watch_until:
            states = self._states_through_outages() or []
            running = {
                run.name: run
                for run, state in states
                if run is not failed and state is not None and state.is_running()
            }
            ages = {name: self._heartbeat_age(run) for name, run in running.items()}
            lapsed, late = attribution(ages, self.heartbeat_timeout_s)
            if lapsed is not None:
                return self._mark_lost(running[lapsed], ages[lapsed] or 0.0)
            if not late and time.monotonic() > first_look_until:
                return None
            time.sleep(1.0)
        return None

    def _where(self, run: RoleRun) -> str:
        host = self.host_of(run)
        return f"node {run.node}" + (f" on host {host}" if host else "") + f", pool {run.pool}"

    def _mark_lost(self, run: RoleRun, silent_s: float) -> str:
        """Mark a flow run whose host is gone crashed (its worker cannot), and say so."""
        message = (
            f"host {self.host_of(run)} lost: the {run.role} flow run {run.name} (node {run.node}, pool "
            f"{run.pool}) sent no heartbeat for {silent_s:.0f} s (cluster.heartbeat_timeout_s="
            f"{self.heartbeat_timeout_s:g}); its host or its worker is gone"
        )
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(run.flow_run_id, Crashed(message=message), force=True)
        self.lost.add(run.flow_run_id)
        self.log(message)
        return message

    def _states_through_outages(self) -> list[tuple[RoleRun, Any]] | None:
        """The role flow runs' states, or None while the Prefect API is unreachable (for at most
        ``API_OUTAGE_S``: then the run fails naming the API)."""
        try:
            states = self._states()
        except Exception as error:  # httpx's connect and read errors, a 5xx while the server starts
            now = time.monotonic()
            if self.api_down_since is None:
                self.api_down_since = now
                self.log(
                    f"the Prefect API does not answer ({type(error).__name__}: {error}); the stages go on"
                )
            if now - self.api_down_since > API_OUTAGE_S:
                raise StageFailed(
                    f"the Prefect API has not answered for {API_OUTAGE_S:g} s ({type(error).__name__}: "
                    f"{error}): the role flow runs cannot be supervised"
                ) from None
            return None
        if self.api_down_since is not None:
            self.log(f"the Prefect API answers again after {time.monotonic() - self.api_down_since:.0f} s")
            self.api_down_since = None
        return states

    def _states_due(self) -> bool:
        """Whether the states may be read again (at most every ``STATES_EVERY_S``); if so, from now."""
        now = time.monotonic()
        if now < self.next_states_at:
            return False
        self.next_states_at = now + STATES_EVERY_S
        return True

    def poll(self) -> bool:
        if not self._states_due():
            return False
        states = self._states_through_outages()
        if states is None:
            return False
        trainers_done = True
        for run, state in states:
            if state is None:
                trainers_done = False
                continue
            if state.is_running() and (silent_s := self._silent_for(run)) is not None:
                raise StageFailed(self._mark_lost(run, silent_s))
            if _ended_badly(state):
                failure = self._failure(run, state)
                lost = self._lost_host_behind(run)
                if lost is None:  # the role's node failed by itself: a trainer role's may restart alone
                    raise StageFailed(failure, stage=f"{run.role}{run.node}")
                raise StageFailed(f"{lost}; with it, {failure}")
            waiting = state.is_scheduled() or state.is_pending()
            if waiting and time.monotonic() - run.submitted_at > self.start_timeout_s:
                raise StageFailed(
                    f"no worker of pool {run.pool!r}"
                    + (f" (work queue {run.queue!r})" if run.queue else "")
                    + f" started the {run.role} flow run {run.name} within "
                    f"cluster.start_timeout_s={self.start_timeout_s:g} s; is a worker polling it "
                    f"(`prefect worker start --pool {run.pool}"
                    + (f" --work-queue {run.queue}" if run.queue else "")
                    + "`)?"
                )
            if run.role == "trainer" and not state.is_completed():
                trainers_done = False
        return trainers_done

    def stop(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Wait up to ``grace_s`` for the role flow runs to end; ask the rest to stop through the run
        directory (``flows/role_stop.py``) and cancel those that have not started; after ``STOP_WAIT_S``
        cancel what still runs through Prefect, and wait for every one to end."""
        self._stop_runs(self.runs, grace_s, "the run is stopping")

    def _stop_runs(self, runs: list[RoleRun], grace_s: float, reason: str) -> None:
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not self._all_final(runs):
            time.sleep(1.0)
        going = [(run, state) for run, state in self._states(runs) if state is None or not state.is_final()]
        for run, _ in going:
            request_stop(stop_request_path(self.run_dir, run.flow_run_id), reason)
            self.log(f"asking the {run.role} flow run {run.name} to stop")
        self._cancel([run for run, state in going if state is None or not state.is_running()])
        deadline = time.monotonic() + STOP_WAIT_S
        while going and time.monotonic() < deadline and not self._all_final(runs):
            time.sleep(1.0)
        self._cancel([run for run, state in self._states(runs) if state is not None and state.is_running()])
        deadline = time.monotonic() + CANCEL_WAIT_S
        while going and time.monotonic() < deadline and not self._all_final(runs):
            # A flow run whose host went silent will never be cancelled by its worker: mark it.
            for run, state in self._states(runs):
                if state is not None and not state.is_final() and (silent := self._silent_for(run)):
                    self._mark_lost(run, silent)
            time.sleep(1.0)
        for run, state in self._states(runs):
            if state is None or not state.is_final():
                self.log(f"the {run.role} flow run {run.name} is still {state.name if state else 'unlisted'}")

    # The trainer role alone (its nodes' flow runs: the ranks and the preprocessor), while the actors'
    # flow runs go on (``launch/stages.py``, ``RestartsTrainerRole``; ``platform/rebase.py``).

    def stop_trainer_role(self) -> None:
        trainers = [run for run in self.runs if run.role == "trainer"]
        self._stop_runs(trainers, grace_s=0, reason="the trainer role restarts")

    def start_trainer_role(self, config: PipelineConfig, model_path: Path) -> None:
        self.runs = [run for run in self.runs if run.role != "trainer"]
        self._submit(config, model_path, ("trainer",))

    def check_actors(self) -> None:
        """``StageFailed`` if an actor flow run has ended or lost its host (while the trainer role is
        down); its states are read at most every ``STATES_EVERY_S``."""
        if not self._states_due():
            return
        actors = [run for run in self.runs if run.role == "actor"]
        try:
            states = self._states(actors)
        except Exception:  # an unreachable API: the actors' own answers still come through the directory
            return
        for run, state in states:
            if state is None:
                continue
            if state.is_final() or state.is_cancelling():
                raise StageFailed(self._failure(run, state), stage=f"{run.role}{run.node}")
            if state.is_running() and (silent_s := self._silent_for(run)) is not None:
                raise StageFailed(self._mark_lost(run, silent_s))

    def _failure(self, run: RoleRun, state: Any) -> str:
        message = state.message or "(no message)"
        return f"the {run.role} flow run {run.name} ({self._where(run)}) is {state.name}: {message}"

    def _cancel(self, runs: list[RoleRun]) -> None:
        if not runs:
            return
        with get_client(sync_client=True) as client:
            for run in runs:
                client.set_flow_run_state(
                    run.flow_run_id, Cancelling(message="the run is stopping"), force=True
                )
                self.log(f"cancelling the {run.role} flow run {run.name}")

    def _all_final(self, runs: list[RoleRun]) -> bool:
        return all(state is not None and state.is_final() for _, state in self._states(runs))

    def describe(self) -> str:
        return ", ".join(
            f"{run.role}{run.node} as flow run {run.name} on {run.pool}"
            + (f" (host {host})" if (host := self.host_of(run)) else "")
            for run in self.runs
        )


def _ended_badly(state: Any) -> bool:
    return bool(state.is_failed() or state.is_crashed() or state.is_cancelled() or state.is_cancelling())


def placement_for(config: PipelineConfig, log: Any = None) -> Any:
    """The launcher's placement factory for ``config.cluster.placement``."""
    if config.cluster.placement == "local":
        return local_placement
    return lambda config, run_dir: PoolPlacement(run_dir, log)
