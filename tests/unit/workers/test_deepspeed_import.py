"""The trainer imports DeepSpeed without MLflow (its autotuner's optional import), in a fresh process."""

from __future__ import annotations

import subprocess
import sys

PROBE = """
import sys
from pipelinerl.workers.deepspeed_import import import_deepspeed
deepspeed = import_deepspeed()
from deepspeed.autotuning import autotuner
assert "mlflow" not in sys.modules, "DeepSpeed's import pulled MLflow in"
assert autotuner.has_mlflow is False
import mlflow  # still importable by anyone who needs it
print("ok", deepspeed.__version__, mlflow.__version__)
"""


def test_deepspeed_is_imported_without_mlflow_which_stays_importable() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ok ")
