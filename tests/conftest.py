"""Shared fixtures: tiny models built locally (no downloads) and isolated tool homes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def build_random_model_dir(path: Path, seed: int = 0, hidden_size: int = 64) -> Path:
    """A small random Qwen2 model with the task tokenizer, saved as a Hugging Face directory."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from pipelinerl.tasks.tokenizer import build_tokenizer

    tokenizer = build_tokenizer()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def random_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_random_model_dir(tmp_path_factory.mktemp("random-model"))


@pytest.fixture(autouse=True, scope="session")
def _isolated_homes(tmp_path_factory: pytest.TempPathFactory) -> None:
    home = tmp_path_factory.mktemp("tool-home")
    os.environ.setdefault("PREFECT_HOME", str(home / "prefect"))
    # The DeepSpeed CPU communication op compiles once (about a minute); keep it across test runs.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))


@pytest.fixture(scope="session")
def warm_model_dir() -> Path:
    """The embedded default model, warm-started exactly as ``pipelinerl run`` does.

    It shares the platform home's cache with ``make run`` (the cache key covers every setting and
    the code version), so the supervised phase runs at most once per machine.
    """
    from pipelinerl.platform.config import load_config
    from pipelinerl.workers.launcher import resolve_model

    return resolve_model(load_config())
