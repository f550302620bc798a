"""The dashboard (``pipelinerl ui``): runs, a live view of the pipeline, comparisons and a JSON API,
read from ``platform.tracking`` (the platform database and MLflow) and the runs' directories only.

``app`` (the FastAPI application and ``serve``), ``pages`` (HTML), ``api`` (JSON), ``service`` (the
payloads), ``queries`` / ``mlflow_reader`` / ``run_files`` (the three read-only readers), ``series``
and ``sampling`` (pure numbers), ``load_benchmark`` (timing a long synthetic run); ``docs/ui.md``.
"""
