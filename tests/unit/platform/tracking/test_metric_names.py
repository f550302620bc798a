"""A metric name MLflow refuses is dropped and named, never allowed to fail the batch it travels in."""

from __future__ import annotations

import logging
import time

from pipelinerl.platform.tracking.mlflow_store import MetricPoint, MlflowStore

BAD, GOOD = "eval/heldout/pass@1", "eval/heldout/pass_at_1"


def test_a_refused_name_does_not_take_the_good_metrics_down(tmp_path, caplog) -> None:
    store = MlflowStore(f"sqlite:///{tmp_path / 'mlflow.db'}", (tmp_path / "artifacts").as_uri())
    run_id = store.start_run("names", "run", {})
    now = time.time()
    with caplog.at_level(logging.ERROR, logger="pipelinerl.tracking"):
        for step in (1, 2):  # the refusal is said once
            store.log_metrics(run_id, [MetricPoint(BAD, 0.5, step, now), MetricPoint(GOOD, 0.5, step, now)])
    assert sorted(m.step for m in store.client.get_metric_history(run_id, GOOD)) == [1, 2]
    refusals = [r.getMessage() for r in caplog.records if "not logged" in r.getMessage()]
    assert refusals == [f"metric {BAD!r} not logged: MLflow names allow only letters, digits and _-. :/"]
