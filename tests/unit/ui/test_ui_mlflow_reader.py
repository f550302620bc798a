"""The MLflow reader: links to the training view, and an unreachable store costs one attempt per
retry period, not one per page refresh."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from pipelinerl.platform.tracking.mlflow_store import MlflowStore
from pipelinerl.ui.mlflow_reader import MlflowReader, MlflowUnavailable
from tests.conftest import worker_port


def test_an_unreachable_server_fails_once_then_at_once_until_the_retry_period(tmp_path: Path) -> None:
    reader = MlflowReader(f"http://127.0.0.1:{worker_port(27003)}", None)  # nothing listens there
    with pytest.raises(MlflowUnavailable, match="Connection refused") as first:
        reader.latest_of_run("abc")
    began = time.perf_counter()
    with pytest.raises(MlflowUnavailable) as second:
        reader.histories("abc", ["eval/success"])
    assert time.perf_counter() - began < 0.05, "no second attempt within the retry period"
    assert str(second.value) == str(first.value)


def test_a_missing_sqlite_store_is_not_created(tmp_path: Path) -> None:
    store = tmp_path / "mlflow.db"
    reader = MlflowReader(f"sqlite:///{store}", "http://127.0.0.1:5000")
    with pytest.raises(MlflowUnavailable, match="no such file"):
        reader.latest_metrics(["pipelinerl"], ["abc"])
    assert not store.exists()
    assert reader.run_url("abc", lookup=False) is None, "no link without the run's experiment"


def test_an_unknown_run_is_an_answer_not_an_outage(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    known = MlflowStore(uri, (tmp_path / "artifacts").as_uri()).start_run("pipelinerl", "r1", {})
    reader = MlflowReader(uri, "http://127.0.0.1:5000")
    with pytest.raises(MlflowUnavailable, match="not found|does not exist|No run"):
        reader.latest_of_run("0123456789abcdef0123456789abcdef")
    assert reader.latest_of_run(known) == {}, "the next request is served"
    assert reader.run_url(known).endswith(f"/runs/{known}?workflowType=machine_learning")
