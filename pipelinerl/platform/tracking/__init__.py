"""Tracking: what a run leaves behind for people to compare, in MLflow and the platform's own database.

``run_tracker`` (one run's owner), ``parent_run`` (comparisons and sweeps), ``mlflow_store`` (the
MLflow client and where its store is), ``metric_registry`` (every metric name, declared once, with
its unit, owner, derivation and old names), ``metrics`` (which record keys reach MLflow), ``db`` / ``store`` /
``db_cli`` (the platform tables, their queries and ``pipelinerl db``), ``figures``,
``comparison`` and ``ratios`` (plots and tables across runs; the one "times faster" ratio).
"""
