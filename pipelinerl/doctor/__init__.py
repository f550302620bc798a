"""``pipelinerl doctor``: whether this machine can run the platform (like ``ds_report`` or
``accelerate env``). Every check says PASS, WARN, FAIL or SKIP with a one-line fix; the command exits
non-zero when any check fails."""
