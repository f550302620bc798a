"""``parent_run``: the parent of a comparison, sweep or benchmark ends with its block's outcome, in
MLflow and in the platform database (real SQLite stores)."""

from __future__ import annotations

import mlflow
import pytest

from pipelinerl.platform.config import load_config
from pipelinerl.platform.tracking.parent_run import parent_run
from pipelinerl.platform.tracking.store import PlatformStore


def tracked_config(tmp_path, enabled: bool = True):
    return load_config(
        None,
        [
            f"tracking.enabled={str(enabled).lower()}",
            f"tracking.mlflow_uri=sqlite:///{tmp_path / 'mlflow.db'}",
            f"tracking.database_url=sqlite:///{tmp_path / 'platform.db'}",
        ],
    )


def statuses(tmp_path, run_id: str, mlflow_run_id: str) -> tuple[str, str]:
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    mlflow_status = client.get_run(mlflow_run_id).info.status
    platform_status = PlatformStore(f"sqlite:///{tmp_path / 'platform.db'}").get_run(run_id).run.status
    return mlflow_status, platform_status


def test_a_completed_block_finishes_the_parent(tmp_path):
    with parent_run(tracked_config(tmp_path), "parent-ok", "compare", {"modes": "a,b"}) as parent:
        assert parent is not None
        parent.log_table({"rows": [1, 2]}, "table.json", {"speedup": 1.5})
    assert statuses(tmp_path, "parent-ok", parent.mlflow_run_id) == ("FINISHED", "finished")


@pytest.mark.parametrize(
    ("error", "mlflow_status", "status"),
    [(ValueError("a child run failed"), "FAILED", "failed"), (KeyboardInterrupt(), "KILLED", "killed")],
)
def test_an_interrupted_block_marks_the_parent_and_reraises(tmp_path, error, mlflow_status, status):
    with pytest.raises(type(error)), parent_run(tracked_config(tmp_path), "parent-x", "sweep") as parent:
        assert parent is not None
        raise error
    assert statuses(tmp_path, "parent-x", parent.mlflow_run_id) == (mlflow_status, status)


def test_without_tracking_there_is_no_parent_and_nothing_is_written(tmp_path):
    with parent_run(tracked_config(tmp_path, enabled=False), "untracked", "compare") as parent:
        assert parent is None
    assert not (tmp_path / "mlflow.db").exists() and not (tmp_path / "platform.db").exists()
