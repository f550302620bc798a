"""Two runs starting at once into a new experiment both find it missing; the second's create is refused
(RESOURCE_ALREADY_EXISTS) and it must join the experiment the first created, not fail (the stack's pools
run and its cancelled run met this on a clean clone)."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from pipelinerl.platform.tracking.mlflow_store import MlflowStore, TrackingError


def test_the_loser_of_a_create_race_joins_the_winners_experiment(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    store = MlflowStore(uri)
    winner = MlflowClient(tracking_uri=uri)
    lookup = store.client.get_experiment_by_name
    created: list[str] = []

    def the_other_run_creates_it_first(name: str):  # between our lookup and our create
        if not created:
            created.append(winner.create_experiment(name))
            return None
        return lookup(name)

    store.client.get_experiment_by_name = the_other_run_creates_it_first  # type: ignore[method-assign]
    assert store.experiment_id("raced") == created[0]


def test_another_refusal_is_still_an_error(tmp_path: Path) -> None:
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}")
    with pytest.raises(TrackingError, match="MLflow store"):
        store.experiment_id("")  # MLflow refuses an empty name
