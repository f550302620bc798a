"""Loading a model in a process with several threads: one load at a time.

transformers' ``from_pretrained`` is not thread-safe (5.x): while it loads, it replaces
``PreTrainedModel.tie_weights`` and ``init_weights`` and torch's init functions with stubs
(``transformers.initialization.no_tie_weights`` / ``no_init_weights``) and puts back what it saved.
Two threads loading at once can each save the other's stub, and ``tie_weights`` then stays a stub for
the rest of the process: every later load leaves a tied LM head untied ("MISSING, newly
initialized"), on the meta device or random, with no error (reproduced here: two threads loading a
small model 40 times each, three times out of three). The launcher loads in-process to measure
held-out success, and runs can share a process (``launch`` in a thread, a sweep's children, the
tests), so every ``from_pretrained`` in the process goes through one lock once
``serialise_model_loading`` has run (idempotent; ``launch`` runs it).
"""

from __future__ import annotations

import functools
import threading
from typing import Any

_LOCK = threading.RLock()  # re-entrant: a load may load (an auto class calls the model class's loader)


def serialise_model_loading() -> None:
    """Make ``PreTrainedModel.from_pretrained`` hold this process's loading lock (once)."""
    from transformers import PreTrainedModel  # noqa: PLC0415 (transformers: only where models load)

    current = PreTrainedModel.__dict__["from_pretrained"]
    if getattr(current.__func__, "_pipelinerl_serialised", False):
        return
    original = current.__func__

    @functools.wraps(original)
    def locked(cls: Any, *args: Any, **kwargs: Any) -> Any:
        with _LOCK:
            return original(cls, *args, **kwargs)

    locked._pipelinerl_serialised = True  # type: ignore[attr-defined]
    PreTrainedModel.from_pretrained = classmethod(locked)  # type: ignore[method-assign,assignment]
