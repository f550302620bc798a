"""How a problem becomes the token ids a model reads, and which tokens end what it writes.

The prompt (``model.chat_template``):

* ``"auto"``: a problem that comes as chat ``messages`` is rendered with the tokenizer's own chat
  template (``add_generation_prompt=True``), after the optional ``model.system_prompt``; a problem
  with plain text only, or a tokenizer without a template, gets the plain text;
* ``"none"``: always the plain text;
* a path: that Jinja template file instead of the tokenizer's, for problems with messages.

Plain text is ``[bos] + tokens(text)``, without ``bos`` for tokenizers that have none. A chat
template writes its own special tokens (Llama 3's starts with ``<|begin_of_text|>``), so nothing
is added to it.

What ends a completion: every end-of-sequence id of the tokenizer and of the model's
``generation_config.json`` (Llama 3 instruct lists several), plus the task's stop strings, which the
actor applies by cutting a finished completion right after the first one (``cut_at_stop``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelinerl.platform.config import ConfigError
from pipelinerl.tasks.base import Message, Problem
from pipelinerl.tasks.tokenizer import encode_prompt


class PromptError(ConfigError):
    """A model directory or prompt setting that cannot give prompts; the message says what is missing."""


@dataclass(frozen=True)
class PromptFormat:
    """The resolved prompt settings: a chat template source (None: plain text) and a system prompt."""

    chat_template: str | None
    system_prompt: str | None = None


def prompt_format(
    tokenizer: Any, chat_template: str = "auto", system_prompt: str | None = None
) -> PromptFormat:
    """Resolve ``model.chat_template`` against ``tokenizer``; a template asked for by path must exist."""
    if chat_template == "none":
        return PromptFormat(None, system_prompt)
    if chat_template == "auto":
        return PromptFormat(getattr(tokenizer, "chat_template", None) or None, system_prompt)
    path = Path(chat_template).expanduser()
    if not path.is_file():
        raise PromptError(
            f"model.chat_template={chat_template!r}: no such file; give 'auto', 'none' or the path of a "
            "Jinja chat template"
        )
    source = path.read_text()
    if not source.strip():
        raise PromptError(f"model.chat_template={chat_template!r}: the file is empty")
    return PromptFormat(source, system_prompt)


def encode_problem(tokenizer: Any, problem: Problem, prompt: PromptFormat) -> list[int]:
    """The prompt ids of ``problem`` under ``prompt`` (see the module docstring)."""
    if prompt.chat_template is None or not problem.messages:
        return encode_prompt(tokenizer, problem.prompt)
    messages = list(problem.messages)
    if prompt.system_prompt and not any(message.role == "system" for message in messages):
        messages.insert(0, Message("system", prompt.system_prompt))
    rendered = tokenizer.apply_chat_template(
        [{"role": message.role, "content": message.content} for message in messages],
        chat_template=prompt.chat_template,
        add_generation_prompt=True,
        tokenize=False,
    )
    return list(tokenizer.encode(rendered, add_special_tokens=False))


def eos_token_ids(tokenizer: Any, model_path: Path | None = None) -> list[int]:
    """Every id that ends a completion: the tokenizer's end-of-sequence token and the model's
    ``generation_config.json`` ``eos_token_id`` (an int or a list), in that order, without repeats."""
    ids: list[int] = []
    if tokenizer.eos_token_id is not None:
        ids.append(int(tokenizer.eos_token_id))
    if model_path is not None and (path := Path(model_path) / "generation_config.json").is_file():
        configured = json.loads(path.read_text()).get("eos_token_id")
        for token in configured if isinstance(configured, list) else [configured]:
            if token is not None and int(token) not in ids:
                ids.append(int(token))
    if not ids:
        where = f" or {model_path}/generation_config.json" if model_path is not None else ""
        raise PromptError(f"no end-of-sequence token in the tokenizer{where}: completions could never end")
    return ids


def pad_token_id(tokenizer: Any) -> int:
    """The tokenizer's padding id, else its end-of-sequence id (Llama-3-style tokenizers have no pad)."""
    if tokenizer.pad_token_id is not None:
        return int(tokenizer.pad_token_id)
    if tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    raise PromptError("the tokenizer has neither a padding nor an end-of-sequence token")


def cut_at_stop(
    token_ids: Sequence[int], decode: Callable[[Sequence[int]], str], stop_strings: Sequence[str]
) -> int | None:
    """The number of tokens to keep so that the completion ends with the first stop string it
    contains (the token that completes it included), or None when it contains none."""
    if not stop_strings:
        return None
    text = decode(token_ids)
    if not any(stop in text for stop in stop_strings):
        return None
    low, high = 1, len(token_ids)  # the shortest prefix whose text holds a stop string
    while low < high:
        middle = (low + high) // 2
        if any(stop in decode(token_ids[:middle]) for stop in stop_strings):
            high = middle
        else:
            low = middle + 1
    return low
