"""The character-level tokenizer: lossless on the task alphabet and reloadable from disk."""

from __future__ import annotations

from pathlib import Path

from transformers import AutoTokenizer

from pipelinerl.tasks import get_task
from pipelinerl.tasks.tokenizer import ALPHABET, build_tokenizer, encode_completion, encode_prompt


def test_round_trip_of_task_text() -> None:
    tokenizer = build_tokenizer()
    task = get_task("arithmetic")
    for problem in task.problems("train", 50, seed=0):
        text = problem.prompt + task.reference_completion(problem)
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert len(ids) == len(text)  # one token per character
        assert tokenizer.unk_token_id not in ids
        assert tokenizer.decode(ids) == text


def test_every_alphabet_character_is_its_own_token() -> None:
    tokenizer = build_tokenizer()
    ids = tokenizer.encode(ALPHABET, add_special_tokens=False)
    assert len(ids) == len(set(ids)) == len(ALPHABET)
    assert tokenizer.decode(ids) == ALPHABET


def test_special_tokens_and_prompt_format() -> None:
    tokenizer = build_tokenizer()
    assert len({tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id}) == 3
    prompt_ids = encode_prompt(tokenizer, "12+3\n")
    assert prompt_ids[0] == tokenizer.bos_token_id
    assert prompt_ids == tokenizer("12+3\n")["input_ids"]  # the default adds <bos> too
    completion_ids = encode_completion(tokenizer, "A:15")
    assert completion_ids[-1] == tokenizer.eos_token_id
    decoded = tokenizer.decode(prompt_ids + completion_ids, skip_special_tokens=True)
    assert decoded == "12+3\nA:15"


def test_unknown_characters_map_to_unk() -> None:
    tokenizer = build_tokenizer()
    assert tokenizer.encode("é", add_special_tokens=False) == [tokenizer.unk_token_id]


def test_save_and_reload_with_auto_tokenizer(tmp_path: Path) -> None:
    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    text = "4821+397\n1+7+0=08\nA:5218"
    assert reloaded(text)["input_ids"] == tokenizer(text)["input_ids"]
    assert reloaded.decode(tokenizer(text)["input_ids"], skip_special_tokens=True) == text
    assert (reloaded.bos_token_id, reloaded.eos_token_id, reloaded.pad_token_id) == (
        tokenizer.bos_token_id,
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )
    assert reloaded.padding_side == "left"
    assert len(reloaded) == len(tokenizer)
