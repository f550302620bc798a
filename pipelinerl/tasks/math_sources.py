"""Where the math task's problems come from: local JSONL, Parquet and saved Hugging Face datasets,
read into question / reference answer / worked solution records with train and eval splits.

Layouts (``dataset``):

* ``"shipped"``: ``pipelinerl/tasks/data/math.jsonl`` (``math_data.py`` writes it);
* ``"generated:<count>"``: the same generator asked for ``count`` problems, built in memory
  (``"generated:<count>:<topic>,<topic>"``: of those topics only, ``math_data.TOPIC_NAMES``);
* a ``.jsonl`` file (one JSON object a line) or a ``.parquet`` file (needs ``pyarrow``);
* a directory holding ``train.jsonl`` (or ``.parquet``) and ``test.jsonl`` or ``validation.jsonl``:
  those are the splits;
* a directory written by ``datasets``' ``save_to_disk`` (needs ``datasets``): a ``DatasetDict``'s
  ``train`` and ``test`` (else ``validation``) splits are the splits; a single ``Dataset``, or a
  dict with one split, is one pool;
* a directory laid out as a Hugging Face Hub dataset repository (what a Hub id resolves to, e.g.
  ``openai/gsm8k``): shard files ``train-00000-of-00001.parquet``, ``test-*.parquet`` (or
  ``validation``, ``.jsonl``), in one folder below it (``data/``), or one per subset (gsm8k's
  ``main/`` and ``socratic/``: ``dataset_subset`` chooses).

A Hub id (``org/name``, revision in ``dataset_revision``) is resolved to its local snapshot by the
launcher before any stage starts (``pipelinerl/platform/hub.py``); ``load_splits`` resolves one
itself when called with an id (the cache only, with ``HF_HUB_OFFLINE=1``).

A pool without splits of its own is split by a stable hash of the question (``eval_fraction`` of
the questions go to eval), or by a field naming each record's split (``split_field``). A question
in both splits is kept in eval only, so train and eval never share a problem.

Reference answers (``answer_format``): ``plain`` (the field as it is; AIME's integers become
text), ``gsm8k`` (the text after the last ``####``, thousands commas dropped), ``boxed`` (the last
``\\boxed{}`` of the field, e.g. a MATH solution).

Every problem in the source is read and checked when the task is built, so a missing file, an
empty one, a record without the question or answer field, or a file type that is not supported
stops a run before any process starts, with a message that names the file and the field.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pipelinerl.platform.config.base import ConfigError
from pipelinerl.platform.hub import looks_like_hub_id, resolve_snapshot
from pipelinerl.tasks.base import Split
from pipelinerl.tasks.math_data import SHIPPED_PATH, generate
from pipelinerl.tasks.math_grading import last_boxed

AnswerFormat = Literal["plain", "gsm8k", "boxed"]
ANSWER_FORMATS: tuple[AnswerFormat, ...] = ("plain", "gsm8k", "boxed")

FILE_SUFFIXES = (".jsonl", ".parquet")
GENERATED_PREFIX = "generated:"
GENERATED_MAX = 200_000
# Names a split field's values may take, and the split each means.
SPLIT_NAMES: dict[str, Split] = {"train": "train", "test": "eval", "eval": "eval", "validation": "eval"}


@dataclass(frozen=True)
class FieldMap:
    """Which fields of a source record hold what, and how the reference answer is written."""

    question: str
    answer: str
    solution: str | None
    answer_format: AnswerFormat
    split: str | None = None


@dataclass(frozen=True)
class MathRecord:
    """One problem of a source: the question, the reference answer, the worked solution if any."""

    question: str
    answer: str
    solution: str | None


@dataclass(frozen=True)
class _Table:
    """The rows of one file or split, and how to name one of them in an error."""

    where: str
    rows: list[dict[str, Any]]
    line_numbers: list[int] | None = None  # JSONL rows: the line each came from

    def locate(self, index: int) -> str:
        if self.line_numbers is not None:
            return f"{self.where} line {self.line_numbers[index]}"
        return f"{self.where} record {index + 1}"


def question_hash(question: str) -> str:
    """A stable hex digest of a question: problem ids and the eval bucket come from it."""
    return hashlib.blake2b(question.encode(), digest_size=8).hexdigest()


def in_eval_bucket(question: str, eval_fraction: float) -> bool:
    """Whether a question of a source without splits belongs to eval (stable across runs)."""
    return int(question_hash(question), 16) / 2**64 < eval_fraction


def load_splits(
    dataset: str,
    fields: FieldMap,
    eval_fraction: float,
    revision: str | None = None,
    subset: str | None = None,
) -> dict[Split, list[MathRecord]]:
    """The train and eval records of ``dataset``, each question once; ValueError on bad input."""
    if names_hub_dataset(dataset):
        try:
            dataset = str(resolve_snapshot(dataset, revision=revision, repo_type="dataset").path)
        except ConfigError as error:
            raise ValueError(str(error)) from None
    elif revision is not None:
        raise ValueError(
            f"dataset_revision={revision!r} needs a Hugging Face Hub id as dataset, got {dataset!r} "
            "(a local path or a built-in source)"
        )
    tables = _read_tables(dataset, subset)
    split_of: dict[Split, list[MathRecord]] = {"train": [], "eval": []}
    for name, table in tables.items():
        for index, row in enumerate(table.rows):
            record = _record(table, index, row, fields)
            if name != "all":
                split_of["train" if name == "train" else "eval"].append(record)
            elif fields.split is not None:
                split_of[_split_value(table, index, row, fields.split)].append(record)
            else:
                split_of["eval" if in_eval_bucket(record.question, eval_fraction) else "train"].append(record)
    evaluation = _unique(split_of["eval"])
    held_out = {record.question for record in evaluation}
    return {
        "train": _unique([r for r in split_of["train"] if r.question not in held_out]),
        "eval": evaluation,
    }


def _unique(records: list[MathRecord]) -> list[MathRecord]:
    seen: set[str] = set()
    unique = []
    for record in records:
        if record.question not in seen:
            seen.add(record.question)
            unique.append(record)
    return unique


def _record(table: _Table, index: int, row: dict[str, Any], fields: FieldMap) -> MathRecord:
    question = _text_field(table, index, row, fields.question, "question_field")
    raw_answer = _text_field(table, index, row, fields.answer, "answer_field")
    answer = reference_answer(raw_answer, fields.answer_format)
    if answer is None:
        expected = "'#### <answer>'" if fields.answer_format == "gsm8k" else "a \\boxed{...}"
        raise ValueError(
            f"{table.locate(index)}: answer_format={fields.answer_format!r} needs {expected} in field "
            f"{fields.answer!r}, got {raw_answer[:200]!r}"
        )
    solution = row.get(fields.solution) if fields.solution is not None else None
    if not isinstance(solution, str) or not solution.strip():
        solution = None
    return MathRecord(question=question.strip(), answer=answer, solution=solution)


def reference_answer(text: str, answer_format: AnswerFormat) -> str | None:
    """The reference answer written in ``text`` under ``answer_format``, or None if it has none."""
    if answer_format == "gsm8k":
        marker = text.rfind("####")
        if marker < 0 or not text[marker + 4 :].strip():
            return None
        return text[marker + 4 :].strip().replace(",", "")
    if answer_format == "boxed":
        return last_boxed(text)
    return text.strip() or None


def _text_field(table: _Table, index: int, row: dict[str, Any], name: str, option: str) -> str:
    if name not in row:
        raise ValueError(
            f"{table.locate(index)} has no field {name!r} ({option}); "
            f"fields found: {', '.join(sorted(row)) or 'none'}"
        )
    value = row[name]
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise ValueError(
            f"{table.locate(index)}: field {name!r} ({option}) must be text or a number, got {value!r}"
        )
    return str(value)


def _split_value(table: _Table, index: int, row: dict[str, Any], field: str) -> Split:
    value = row.get(field)
    if not isinstance(value, str) or value.lower() not in SPLIT_NAMES:
        found = "missing" if field not in row else repr(value)
        raise ValueError(
            f"{table.locate(index)}: split_field {field!r} is {found}; valid values: {', '.join(SPLIT_NAMES)}"
        )
    return SPLIT_NAMES[value.lower()]


def names_hub_dataset(dataset: str) -> bool:
    """A dataset meant as a Hub id: org/name shaped, no local path, no .jsonl/.parquet file name."""
    return (
        looks_like_hub_id(dataset)
        and not dataset.startswith(GENERATED_PREFIX)
        and not Path(dataset).expanduser().exists()
        and not dataset.lower().endswith(FILE_SUFFIXES)
    )


def _read_tables(dataset: str, subset: str | None = None) -> dict[str, _Table]:
    """``{"all": ...}`` for a pool without splits, else ``{"train": ..., "eval": ...}``."""
    if dataset.startswith(GENERATED_PREFIX):
        return {"all": _generated(dataset)}
    path = SHIPPED_PATH if dataset == "shipped" else Path(dataset).expanduser()
    if not path.exists():
        raise ValueError(
            f"dataset {dataset!r}: no such file or directory; give 'shipped', a .jsonl or .parquet file, "
            "a directory with train.jsonl and test.jsonl, a saved Hugging Face dataset directory, "
            "or a Hugging Face Hub id (org/name)"
        )
    if path.is_dir():
        return _read_directory(path, subset)
    if subset is not None:
        raise ValueError(f"dataset_subset={subset!r} needs a dataset directory, got the file {dataset!r}")
    return {"all": _read_file(path)}


def _generated(dataset: str) -> _Table:
    """``generated:<count>[:<topic>,<topic>...]``: the shipped set's generator asked for more problems,
    built in memory (with every topic, the first 400 are the shipped set), optionally of some topics
    only (``math_data.TOPIC_NAMES``); for runs that need more, or other, data than the shipped file."""
    count_text, _, topics_text = dataset.removeprefix(GENERATED_PREFIX).partition(":")
    if not count_text.isdigit() or not 1 <= int(count_text) <= GENERATED_MAX:
        raise ValueError(
            f"dataset {dataset!r}: give 'generated:<count>' with a count from 1 to {GENERATED_MAX}, "
            "optionally ':<topic>,<topic>'"
        )
    topics = [name.strip() for name in topics_text.split(",")] if topics_text else None
    try:
        return _Table(dataset, list(generate(int(count_text), topics=topics)))
    except ValueError as error:
        raise ValueError(f"dataset {dataset!r}: {error}") from None


def _read_file(path: Path) -> _Table:
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        table = _read_jsonl(path)
    elif suffix == ".parquet":
        table = _read_parquet(path)
    else:
        raise ValueError(
            f"dataset {str(path)!r}: unsupported file type {path.suffix or '(none)'!r}; valid: "
            f"{', '.join(FILE_SUFFIXES)}, a directory with train and test files, "
            "or a saved Hugging Face dataset"
        )
    if not table.rows:
        raise ValueError(f"dataset {str(path)!r} is empty: it holds no records")
    return table


def _read_jsonl(path: Path) -> _Table:
    rows: list[dict[str, Any]] = []
    line_numbers: list[int] = []
    with path.open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path} line {number} is not JSON ({error.msg})") from error
            if not isinstance(row, dict):
                raise ValueError(f"{path} line {number} is not a JSON object, got {type(row).__name__}")
            rows.append(row)
            line_numbers.append(number)
    return _Table(str(path), rows, line_numbers)


def _read_parquet(path: Path) -> _Table:
    try:
        import pyarrow.parquet as parquet  # noqa: PLC0415 (optional: only Parquet sources need it)
    except ImportError as error:
        raise ValueError(
            f"reading the Parquet file {path} needs the pyarrow package (pip install pyarrow)"
        ) from error
    try:
        rows = parquet.read_table(path).to_pylist()
    except (
        Exception
    ) as error:  # pyarrow's errors are of many types; all mean "not a Parquet file we can read"
        raise ValueError(f"{path} is not a readable Parquet file ({error})") from error
    return _Table(str(path), rows)


def _read_directory(path: Path, subset: str | None = None) -> dict[str, _Table]:
    if subset is not None:
        inner = path / subset
        if not inner.is_dir() or Path(subset).is_absolute() or ".." in Path(subset).parts:
            found = sorted(p.name for p in path.iterdir() if p.is_dir() and not p.name.startswith("."))
            raise ValueError(
                f"dataset directory {str(path)!r} has no subset {subset!r}; "
                f"found: {', '.join(found) or 'none'}"
            )
        path = inner
    if (path / "dataset_dict.json").is_file() or (path / "state.json").is_file():
        return _read_saved_dataset(path)
    if shards := _split_shards(path):
        return shards
    train = next(
        (path / f"train{suffix}" for suffix in FILE_SUFFIXES if (path / f"train{suffix}").is_file()), None
    )
    evaluation = next(
        (
            path / f"{name}{suffix}"
            for name in ("test", "validation")
            for suffix in FILE_SUFFIXES
            if (path / f"{name}{suffix}").is_file()
        ),
        None,
    )
    if train is None or evaluation is None:
        raise ValueError(
            f"dataset directory {str(path)!r} holds neither train.jsonl (or .parquet) with test.jsonl "
            "or validation.jsonl (or .parquet), nor a saved Hugging Face dataset "
            "(dataset_dict.json or state.json)"
        )
    return {"train": _read_file(train), "eval": _read_file(evaluation)}


_SHARD = re.compile(r"^(train|test|validation)([-_.].*)?$")


def _split_shards(path: Path) -> dict[str, _Table] | None:
    """A Hub dataset repository's layout: ``train-*`` and ``test-*`` (or ``validation-*``) shard files in
    one folder at or below ``path``; None when ``path`` holds plain train/test files or no shards."""
    if any((path / f"train{suffix}").is_file() for suffix in FILE_SUFFIXES):
        return None  # the plain layout (train.jsonl beside test.jsonl) is read as before
    shards: dict[Path, dict[str, list[Path]]] = {}
    for file in sorted(path.rglob("*")):
        relative = file.relative_to(path)
        if any(part.startswith(".") for part in relative.parts) or file.suffix.lower() not in FILE_SUFFIXES:
            continue
        if (match := _SHARD.match(file.name.removesuffix(file.suffix))) and file.is_file():
            shards.setdefault(file.parent, {}).setdefault(match.group(1), []).append(file)
    usable = {folder: splits for folder, splits in shards.items() if "train" in splits}
    if not usable:
        return None
    if len(usable) > 1:
        names = ", ".join(str(folder.relative_to(path)) for folder in usable)
        raise ValueError(
            f"dataset directory {str(path)!r} holds several subsets ({names}): choose one with dataset_subset"
        )
    folder, splits = next(iter(usable.items()))
    evaluation = next((name for name in ("test", "validation") if name in splits), None)
    if evaluation is None:
        return {"all": _concatenated(folder, "train", splits["train"])}
    return {
        "train": _concatenated(folder, "train", splits["train"]),
        "eval": _concatenated(folder, evaluation, splits[evaluation]),
    }


def _concatenated(folder: Path, split: str, files: list[Path]) -> _Table:
    tables = [_read_file(file) for file in files]
    if len(tables) == 1:
        return tables[0]
    return _Table(f"{folder} split {split!r}", [row for table in tables for row in table.rows])


def _read_saved_dataset(path: Path) -> dict[str, _Table]:
    try:
        import datasets  # noqa: PLC0415 (optional: only saved Hugging Face datasets need it)
    except ImportError as error:
        raise ValueError(
            f"reading the saved Hugging Face dataset {path} needs the datasets package (pip install datasets)"
        ) from error
    try:
        loaded = datasets.load_from_disk(str(path))
    except Exception as error:  # a corrupt or foreign directory: say which and why
        raise ValueError(f"{path} is not a readable saved Hugging Face dataset ({error})") from error
    if isinstance(loaded, datasets.DatasetDict):
        names = list(loaded)
        evaluation = next((name for name in ("test", "validation") if name in loaded), None)
        if "train" in loaded and evaluation is not None:
            chosen = {"train": "train", "eval": evaluation}
        elif len(names) == 1:
            chosen = {"all": names[0]}
        else:
            raise ValueError(
                f"saved dataset {path} has splits {', '.join(names)}; "
                "need 'train' with 'test' or 'validation', or a single split"
            )
        tables = {key: _Table(f"{path} split {name!r}", list(loaded[name])) for key, name in chosen.items()}
    else:
        tables = {"all": _Table(str(path), list(loaded))}
    for table in tables.values():
        if not table.rows:
            raise ValueError(f"dataset {table.where} is empty: it holds no records")
    return tables
