"""A character-level tokenizer for the shipped tasks, built locally (no hub download).

Every printable ASCII character and the newline is one token; anything else maps to ``<unk>``.
Special tokens: ``<pad>`` (0), ``<bos>`` (1), ``<eos>`` (2), ``<unk>`` (3). Encoding with
``add_special_tokens=True`` (the ``transformers`` default) prepends ``<bos>``, which is exactly the
prompt format the actor uses: ``[bos] + chars(problem.prompt)``. Completions are encoded without
special tokens and end with ``<eos>``. Decoding joins the characters with nothing in between.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

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


def encode_prompt(tokenizer: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """The actor's prompt ids: ``[bos] + chars(prompt)``."""
    return [tokenizer.bos_token_id, *tokenizer.encode(prompt, add_special_tokens=False)]


def encode_completion(tokenizer: PreTrainedTokenizerFast, completion: str) -> list[int]:
    """The training target ids for a completion: ``chars(completion) + [eos]``."""
    return [*tokenizer.encode(completion, add_special_tokens=False), tokenizer.eos_token_id]
