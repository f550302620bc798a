"""Small random-weight models of real architectures with tokenizers built here to mimic real families.

Nothing is downloaded: each tokenizer is a byte-level BPE trained with ``tokenizers`` on a corpus
written here, wrapped with the special tokens, chat template and generation config of its family:

* ``qwen_style``: Qwen2 architecture; no BOS token, ``<|endoftext|>`` as pad, ``<|im_end|>`` ends
  a chat turn (the model's generation config lists both as end-of-sequence ids), and an
  ``<|im_start|>role ... <|im_end|>`` chat template;
* ``llama_style``: Llama architecture; ``<|begin_of_text|>`` as BOS (the chat template writes it),
  **no pad token**, ``<|eot_id|>`` and ``<|end_of_text|>`` as end-of-sequence ids, and Llama 3's
  header-style chat template.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{{ message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


CORPUS_WORDS = (
    "the of and to a in is that for it as with was on be by at this from have or one had not "
    "but what all were when we there can an your which their said if do will each about how up "
    "out them then she many some so these would other into has more her two like him see time "
    "could no make than first been its who now people my made over did down only way find use "
    "may water long little very after words called just where most know apples kiwi store "
    "bought total reason step answer final think solve equation fraction number sum product "
    "difference remainder percent"
)


def _corpus() -> list[str]:
    """Text like the tasks' (numbers, words, LaTeX, tags) for the BPE merges; any byte still encodes."""
    words = CORPUS_WORDS.split()
    lines = [" ".join(words[i : i + 12]) for i in range(0, len(words), 7)]
    lines += [f"{a}+{b}={a + b}" for a in range(0, 200, 7) for b in range(0, 200, 11)]
    lines += [r"\boxed{\frac{1}{2}} \sqrt{2} x^2 + 3x - 4 = 0 <answer>42</answer> Let's think step by step."]
    return lines * 3


def _byte_level_bpe(special_tokens: list[str], vocab_size: int = 600) -> Tokenizer:
    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(_corpus(), trainer)
    return backend


def qwen_style_tokenizer() -> PreTrainedTokenizerFast:
    backend = _byte_level_bpe(["<|endoftext|>", "<|im_start|>", "<|im_end|>"])
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=QWEN_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def llama_style_tokenizer() -> PreTrainedTokenizerFast:
    specials = [
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|start_header_id|>",
        "<|end_header_id|>",
        "<|eot_id|>",
    ]
    backend = _byte_level_bpe(specials)
    bos_id = backend.token_to_id("<|begin_of_text|>")
    backend.post_processor = processors.TemplateProcessing(
        single="<|begin_of_text|> $A",
        pair="<|begin_of_text|> $A <|begin_of_text|> $B",
        special_tokens=[("<|begin_of_text|>", bos_id)],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token="<|begin_of_text|>",
        eos_token="<|eot_id|>",
        chat_template=LLAMA3_CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def build_family_model_dir(path: Path, family: str, seed: int = 0, hidden_size: int = 64) -> Path:
    """A random model of ``family`` ("qwen_style" or "llama_style") with its tokenizer, saved at ``path``."""
    sizes = dict(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
    )
    if family == "qwen_style":
        tokenizer = qwen_style_tokenizer()
        eos = [
            tokenizer.convert_tokens_to_ids("<|im_end|>"),
            tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        ]
        config = Qwen2Config(
            vocab_size=len(tokenizer), eos_token_id=eos[0], pad_token_id=tokenizer.pad_token_id, **sizes
        )
        model_class = Qwen2ForCausalLM
        generation = {"eos_token_id": eos, "pad_token_id": tokenizer.pad_token_id}
    elif family == "llama_style":
        tokenizer = llama_style_tokenizer()
        eos = [
            tokenizer.convert_tokens_to_ids("<|eot_id|>"),
            tokenizer.convert_tokens_to_ids("<|end_of_text|>"),
        ]
        config = LlamaConfig(
            vocab_size=len(tokenizer), bos_token_id=tokenizer.bos_token_id, eos_token_id=eos, **sizes
        )
        model_class = LlamaForCausalLM
        generation = {"bos_token_id": tokenizer.bos_token_id, "eos_token_id": eos}
    else:
        raise ValueError(f"family {family!r}: expected 'qwen_style' or 'llama_style'")
    torch.manual_seed(seed)
    model = model_class(config)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # Written last: save_pretrained writes its own generation config from the model config.
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))
    return path
