"""Prompts as the actor builds them, for tokenizers of the real families: no BOS, no pad, EOS lists,
chat templates (the tokenizer's, none, or a file), system prompts; stop strings."""

from __future__ import annotations

from pathlib import Path

import pytest
from transformers import AutoTokenizer

from pipelinerl.tasks.base import Message, Problem
from pipelinerl.tasks.prompting import (
    PromptError,
    PromptFormat,
    cut_at_stop,
    encode_problem,
    eos_token_ids,
    pad_token_id,
    prompt_format,
)
from pipelinerl.tasks.tokenizer import build_tokenizer, encode_prompt

CHAT = Problem("p1", "What is 2+2?", "4", messages=(Message("user", "What is 2+2?"),))
PLAIN = Problem("p2", "2+2\n", "4")


@pytest.fixture(scope="module")
def qwen(qwen_style_model_dir: Path):
    return AutoTokenizer.from_pretrained(qwen_style_model_dir)


@pytest.fixture(scope="module")
def llama(llama_style_model_dir: Path):
    return AutoTokenizer.from_pretrained(llama_style_model_dir)


def test_plain_prompts_get_a_bos_only_from_tokenizers_that_have_one(qwen, llama) -> None:
    assert qwen.bos_token_id is None
    assert encode_prompt(qwen, "2+2") == qwen.encode("2+2", add_special_tokens=False)
    assert encode_prompt(llama, "2+2") == [llama.bos_token_id, *llama.encode("2+2", add_special_tokens=False)]
    characters = build_tokenizer()
    assert encode_prompt(characters, "2+2")[0] == characters.bos_token_id


def test_auto_renders_messages_with_the_tokenizers_template_and_a_system_prompt(qwen, llama) -> None:
    text = qwen.decode(encode_problem(qwen, CHAT, prompt_format(qwen, "auto", "Be brief.")))
    assert text == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    ids = encode_problem(llama, CHAT, prompt_format(llama, "auto"))
    assert ids.count(llama.bos_token_id) == 1 and ids[0] == llama.bos_token_id, "the template writes the BOS"
    assert llama.decode(ids).endswith("<|start_header_id|>assistant<|end_header_id|>\n\n")


def test_a_problem_without_messages_or_none_gives_plain_text(qwen) -> None:
    assert encode_problem(qwen, PLAIN, prompt_format(qwen, "auto")) == encode_prompt(qwen, PLAIN.prompt)
    assert encode_problem(qwen, CHAT, prompt_format(qwen, "none")) == encode_prompt(qwen, CHAT.prompt)
    # A tokenizer without a template (the character tokenizer) falls back to plain text under auto.
    characters = build_tokenizer()
    assert prompt_format(characters, "auto").chat_template is None


def test_a_template_file_replaces_the_tokenizers(qwen, tmp_path: Path) -> None:
    template = tmp_path / "chat.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}A:")
    ids = encode_problem(qwen, CHAT, prompt_format(qwen, str(template)))
    assert qwen.decode(ids) == "[user] What is 2+2?\nA:"
    with pytest.raises(PromptError, match="no such file"):
        prompt_format(qwen, str(tmp_path / "missing.jinja"))
    (tmp_path / "empty.jinja").write_text("  \n")
    with pytest.raises(PromptError, match="empty"):
        prompt_format(qwen, str(tmp_path / "empty.jinja"))


def test_eos_ids_come_from_the_tokenizer_and_the_generation_config(
    qwen, llama, qwen_style_model_dir: Path, llama_style_model_dir: Path
) -> None:
    im_end, endoftext = qwen.convert_tokens_to_ids(["<|im_end|>", "<|endoftext|>"])
    assert eos_token_ids(qwen, qwen_style_model_dir) == [im_end, endoftext]
    eot, end_of_text = llama.convert_tokens_to_ids(["<|eot_id|>", "<|end_of_text|>"])
    assert eos_token_ids(llama, llama_style_model_dir) == [eot, end_of_text]
    assert eos_token_ids(llama) == [eot]


def test_padding_falls_back_to_the_eos_token(qwen, llama) -> None:
    assert llama.pad_token_id is None
    assert pad_token_id(llama) == llama.eos_token_id
    assert pad_token_id(qwen) == qwen.pad_token_id


def test_a_completion_is_cut_right_after_its_first_stop_string(qwen) -> None:
    ids = qwen.encode("so <answer>42</answer> and more </answer> text", add_special_tokens=False)
    keep = cut_at_stop(ids, qwen.decode, ["</answer>"])
    assert keep is not None and qwen.decode(ids[:keep]).endswith("</answer>")
    assert qwen.decode(ids[:keep]).count("</answer>") == 1
    assert "</answer>" not in qwen.decode(ids[: keep - 1])
    assert cut_at_stop(ids, qwen.decode, ["<stop>"]) is None
    assert cut_at_stop(ids, qwen.decode, []) is None


def test_the_prompt_format_default_is_plain_text() -> None:
    assert PromptFormat(None).chat_template is None
