"""The config's model as the doctor sees it, without downloading or allocating it: where it comes from,
its class, and the shape the memory figures need (parameters, layers, KV heads, head size)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pipelinerl.doctor import memory_need as need
from pipelinerl.platform.config import ConfigError, PipelineConfig
from pipelinerl.platform.hub import fetch_command, hub_cache_dir


@dataclass(frozen=True)
class ModelFacts:
    """The config's model as the doctor resolved it: where from, its class and its shape."""

    source: str
    architecture: str
    shape: need.ModelShape


def cached_hub_snapshot(config: PipelineConfig) -> Path:
    """The cached snapshot of ``model.path``'s Hub id, never downloaded; ConfigError naming the id and
    the command that fetches it (the launcher's own words, platform/hub.py) when it is not cached."""
    from huggingface_hub import try_to_load_from_cache  # noqa: PLC0415 (only for a Hub id)

    model = config.model
    repo_id, cache = str(model.path), hub_cache_dir(model.cache_dir)
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=cache, revision=model.revision)
    if isinstance(found, str):
        return Path(found).parent
    label = repo_id + (f" at revision {model.revision!r}" if model.revision else "")
    fetch = fetch_command(repo_id, model.revision, "model", model.cache_dir)
    raise ConfigError(
        f"model.path: model {label} is not in the Hugging Face cache {cache} and the doctor reads the "
        f"cache only; fetch it first: {fetch}"
    )


def model_facts(config: PipelineConfig) -> ModelFacts:
    """The config's model, built on the meta device: the embedded tiny model (model.path empty), a
    checkpoint (run.resume_from), a local directory or a cached Hub snapshot. Parameters are counted
    once each (tied embeddings share one)."""
    import torch  # noqa: PLC0415 (heavy: only when the check runs)
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: PLC0415 (heavy)

    directory: Path | None = config.run.resume_from or config.model.path
    source = f"checkpoint {directory}" if config.run.resume_from else str(directory)
    if config.run.resume_from is None and config.model.is_hub_id():
        directory = cached_hub_snapshot(config)
        source = f"{config.model.path} (cached snapshot {directory.name[:12]})"
    with torch.device("meta"):
        if directory is None:
            from pipelinerl.launch.warmstart import build_tiny_model  # noqa: PLC0415 (torch, transformers)
            from pipelinerl.tasks.tokenizer import build_tokenizer  # noqa: PLC0415 (transformers)

            model = build_tiny_model(build_tokenizer())
            source = "the embedded tiny model"
        else:
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(directory))
    text = model.config.get_text_config()
    heads = int(text.num_attention_heads)
    shape = need.ModelShape(
        params=sum(parameter.numel() for parameter in model.parameters()),
        layers=int(text.num_hidden_layers),
        kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
        head_dim=int(getattr(text, "head_dim", None) or text.hidden_size // heads),
    )
    return ModelFacts(source, type(model).__name__, shape)
