"""DeepSpeed, imported without MLflow.

DeepSpeed's autotuner imports MLflow whenever it is installed (``deepspeed/autotuning/autotuner.py``:
``try: import mlflow``), and the platform installs it: that import was most of a trainer rank's
start (on this 2-core machine, 12 of the 21 s ``import deepspeed`` took under load; docs/benchmarks.md,
"Test suite"). The trainer never autotunes, so it imports DeepSpeed with MLflow hidden: the
autotuner sees it missing (``has_mlflow = False``) and nothing else in DeepSpeed needs it.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def import_deepspeed() -> ModuleType:
    """``deepspeed``, its autotuner kept from importing MLflow (which stays importable afterwards)."""
    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        return importlib.import_module("deepspeed")
    sys.modules["mlflow"] = None  # type: ignore[assignment]  # `import mlflow` raises ImportError
    try:
        return importlib.import_module("deepspeed")
    finally:
        del sys.modules["mlflow"]
