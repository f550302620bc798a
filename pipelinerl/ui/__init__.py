"""The dashboard (``pipelinerl ui``): a live view of the pipeline and the paper's figures, read from
``platform.tracking`` only. Nothing lives here yet; the dashboard issue fills it."""
