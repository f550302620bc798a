"""The simulator behind ``pipelinerl plan``: what a configuration will do on a cluster, before it runs.

* ``costs``: the cost model, each figure in seconds (a decode step, a prefill, a trainer step, a weight
  transfer, an in-flight update's pause);
* ``lengths``: completion-length distributions (fixed, empirical, lognormal from a mean and a p90);
* ``simulate``: a discrete-event model of the platform's pipeline (engines with H slots, the queue,
  the trainer, the weight updates), in the platform's modes, and the figures a run would report.

Pure logic: no processes, no I/O. It imports the config and ``rl`` only, never ``workers`` (it models
them, it does not run them).
"""
