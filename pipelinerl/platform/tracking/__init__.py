"""Tracking: what a run leaves behind for people to compare, in MLflow and the platform's own database.

``run_tracker`` (one run's owner), ``parent_run`` (comparisons and sweeps), ``mlflow_store`` (the
MLflow client and where its store is), ``metrics`` (stable metric names), ``db`` / ``store`` /
``db_cli`` (the platform tables, their queries and ``pipelinerl db``), ``figures`` and
``comparison`` (plots and tables across runs).
"""
