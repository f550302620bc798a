"""A character-level tokenizer for the shipped tasks, built locally (no hub download).

Every printable ASCII character and the newline is one token; anything else maps to ``<unk>``.
Special tokens: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3). Encoding with
``add_special_tokens=True`` (the ``transformers`` default) prepends ``<bos>``, which is exactly the
prompt format the actor uses: ``[bos] + chars(problem.prompt)``. Completions are encoded without
special tokens and end with ``<eos>``. Decoding joins the characters with nothing in between.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
ALPHABET: str = "\n" + "".join(chr(code) for code in range(32, 127))


def build_tokenizer() -> PreTrainedTokenizerFast:
    """The character-level tokenizer (deterministic: same vocabulary and ids on every call)."""
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *ALPHABET])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Every character (the newline included) is its own pre-token, so no merges ever happen.
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    backend.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
    )
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )


def encode_prompt(tokenizer: PreTrainedTokenizerBase, prompt: str) -> list[int]:
    """A plain-text prompt's ids: ``[bos] + tokens(prompt)``, without ``bos`` for tokenizers that have
    none (Qwen-style byte-level BPE)."""
    ids = tokenizer.encode(prompt, add_special_tokens=False)
    return ids if tokenizer.bos_token_id is None else [tokenizer.bos_token_id, *ids]


def encode_completion(tokenizer: PreTrainedTokenizerBase, completion: str) -> list[int]:
    """The training target ids for a completion: ``tokens(completion) + [eos]``."""
    if tokenizer.eos_token_id is None:
        raise ValueError("the tokenizer has no end-of-sequence token, so a completion cannot be ended")
    return [*tokenizer.encode(completion, add_special_tokens=False), tokenizer.eos_token_id]
