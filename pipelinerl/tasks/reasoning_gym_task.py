"""The reasoning-gym task: any of reasoning-gym's procedural generators as a source of checkable problems.

reasoning-gym (https://github.com/open-thought/reasoning-gym) generates problems offline from a
seed (arithmetic, algebra, logic puzzles, games, ...) and scores answers with a verifier per
generator. A run picks one generator and its parameters::

    [task]
    name = "reasoning_gym"
    options = {generator = "chain_sum", params = {min_terms = 2, max_terms = 4}}

Prompt and completion (``chain_sum``)::

    prompt:      "State the final answer to the following arithmetic problem: 12 + 7 =\n\n"
                 "Reason step by step, then give only the final answer inside <answer></answer> tags."
    completion:  "12 + 7 = 19. <answer>19</answer>"

Splits: a question belongs to ``eval`` iff a stable hash of its text falls in the eval bucket, so
train and eval are disjoint for every seed and count. ``problems`` draws from the generator in
fixed-size chunks, each seeded by (generator, split, seed, chunk number), keeps the first
occurrence of each question of its split and rejects the rest. A generator with few distinct
questions (small parameter ranges) runs dry: after ``PATIENCE_DRAWS`` draws with nothing new,
``problems`` returns what it found and logs a warning. ``problems`` is as deterministic as the
generator: in reasoning-gym 0.1.25, ``list_functions`` differs between calls, and
``isomorphic_strings``, ``polynomial_multiplication`` and ``ransom_note`` between processes unless
``PYTHONHASHSEED`` is fixed (they iterate over sets of strings).

Scoring: the answer is the content of the last ``<answer>`` tag, up to its ``</answer>`` or, when
the tag is still open, to the end of the completion. ``</answer>`` is the stop string, and a
completion cut there may lack the closing tag; it is scored the same. The generator's own
``score_answer`` then gives the reward: 1.0 is ``correct``; anything less is ``wrong`` with the
generator's partial credit as the reward (e.g. ``gsm_symbolic`` gives 0.01 for a wrong number).

The verifiers run in a child process (``_Verifier``): several of them (``countdown``, ``puzzle24``,
the integration and polynomial generators) evaluate the answer with sympy's ``parse_expr``, which
can run for ever (``<answer>9**9**9**9</answer>``) and executes Python builtins named in the text.
A call past ``SCORE_TIMEOUT_S`` kills the child (the next call starts a new one) and scores
``unparsable``. The child keeps the trainer's process safe from hangs and crashes; it is no sandbox.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import math
import pickle
import select
import subprocess
import sys
import threading
from collections.abc import Mapping
from typing import Any

from pipelinerl.tasks.base import Message, Problem, Score, Split

try:
    import reasoning_gym
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS
except ImportError as error:  # an optional dependency: say how to get it
    raise ImportError(
        "the reasoning_gym task needs the reasoning-gym package: pip install 'reasoning-gym>=0.1.25'"
    ) from error

logger = logging.getLogger(__name__)

DEFAULT_INSTRUCTION = "Reason step by step, then give only the final answer inside <answer></answer> tags."
# One question in eight (by hash) is held out, as in the arithmetic task.
EVAL_BUCKETS = 8
# Items per generator instance: reasoning-gym's default size. Fixed (not derived from ``count``) so
# that a longer request extends a shorter one; some generators precompute ``size`` items up front.
CHUNK_SIZE = 500
# Consecutive draws that found no new question of the split before ``problems`` gives up: far more
# than a large question space ever needs (eval accepts one draw in eight), few seconds for a small one.
PATIENCE_DRAWS = 5_000
# Beyond this many draws per requested problem a generator is running dry even if it still trickles.
MAX_DRAWS_PER_PROBLEM = 50
# Set by ``problems`` (its ``seed`` and the chunking), so not valid in ``params``.
_TASK_CONTROLLED_PARAMS = ("seed", "size")
# A verifier call takes milliseconds; one that runs this long is stuck (see the module docstring).
SCORE_TIMEOUT_S = 10.0
# Starting the verifier's child imports reasoning-gym (about 2 s on an idle machine).
VERIFIER_START_TIMEOUT_S = 120.0
_OPEN_TAG, _CLOSE_TAG = "<answer>", "</answer>"
_GALLERY = "https://github.com/open-thought/reasoning-gym/blob/main/GALLERY.md"


def generator_names() -> list[str]:
    """The names of reasoning-gym's generators (valid values of the ``generator`` option), sorted."""
    return sorted(DATASETS)


def extract_answer(completion: str) -> str | None:
    """The stripped content of the last ``<answer>`` tag (closed or still open); None without one."""
    start = completion.rfind(_OPEN_TAG)
    if start == -1:
        return None
    content = completion[start + len(_OPEN_TAG) :]
    end = content.find(_CLOSE_TAG)
    if end != -1:
        content = content[:end]
    content = content.strip()
    return content or None


def _digest(text: str) -> bytes:
    return hashlib.blake2b(text.encode(), digest_size=8).digest()


def _is_eval(question: str) -> bool:
    return int.from_bytes(_digest(question), "big") % EVAL_BUCKETS == 0


def _chunk_seed(generator: str, split: Split, seed: int, chunk: int) -> int:
    # A hashed 32-bit seed per chunk: generators seed item ``i`` with ``seed + i``, so consecutive
    # seeds would repeat each other's items shifted by one.
    digest = hashlib.blake2b(f"{generator}/{split}/{seed}/{chunk}".encode(), digest_size=4).digest()
    return int.from_bytes(digest, "big")


def _check_generator(generator: object) -> str:
    if not isinstance(generator, str) or generator not in DATASETS:
        names = generator_names()
        close = difflib.get_close_matches(str(generator), names, n=5, cutoff=0.5)
        hint = f"closest: {', '.join(close)}" if close else "no close match"
        raise ValueError(
            f"generator {generator!r} is not a reasoning-gym generator ({hint}); all {len(names)} are "
            f"listed by pipelinerl.tasks.reasoning_gym_task.generator_names() and in {_GALLERY}"
        )
    return generator


def _check_params(generator: str, params: object) -> dict[str, Any]:
    if not isinstance(params, Mapping):
        raise ValueError(f"params must be a table of {generator}'s parameters, got {params!r}")
    _, config_class = DATASETS[generator]
    accepted = [
        field.name for field in dataclasses.fields(config_class) if field.name not in _TASK_CONTROLLED_PARAMS
    ]
    for key in params:
        if key in _TASK_CONTROLLED_PARAMS:
            raise ValueError(
                f"params.{key} is set by the task (from problems()' seed and its chunking), not in params; "
                f"{generator} accepts: {', '.join(accepted) or '(no parameters)'}"
            )
        if key not in accepted:
            raise ValueError(
                f"params.{key} is not a parameter of reasoning-gym generator {generator!r}; "
                f"it accepts: {', '.join(accepted) or '(no parameters)'}"
            )
    return dict(params)


def _create(generator: str, params: Mapping[str, Any], seed: int, size: int) -> ProceduralDataset:
    try:
        return reasoning_gym.create_dataset(generator, seed=seed, size=size, **params)
    except Exception as error:  # reasoning-gym validates with asserts, TypeErrors, ValueErrors
        raise ValueError(
            f"reasoning-gym generator {generator!r} rejected params {dict(params)!r}: "
            f"{type(error).__name__}: {error}"
        ) from error


# The child's program: build the generator once, then answer (answer, entry) requests with
# ["ok", score] or ["error", repr]. Requests (pickled: entries hold Fractions) come on stdin from the
# parent; replies go back as JSON lines on the original stdout, never pickled: some scorers evaluate
# Python written in the answer, so the child is not trusted, and unpickling its reply would let a
# completion run code in the preprocessor. What the library prints goes to stderr.
_VERIFIER_PROGRAM = """
import json, os, pickle, sys
replies = os.fdopen(os.dup(1), "wb")
os.dup2(2, 1)
requests = sys.stdin.buffer
import reasoning_gym
generator, params = pickle.load(requests)
dataset = reasoning_gym.create_dataset(generator, seed=0, size=1, **params)
def reply(status, value):
    replies.write(json.dumps([status, value]).encode() + b"\\n")
    replies.flush()
reply("ok", "ready")
while True:
    try:
        answer, entry = pickle.load(requests)
    except EOFError:
        break
    try:
        reply("ok", float(dataset.score_answer(answer, entry)))
    except Exception as error:
        reply("error", repr(error))
"""


class _Verifier:
    """One generator's ``score_answer`` in a child process, killed and restarted when a call overruns."""

    def __init__(self, generator: str, params: Mapping[str, Any]) -> None:
        self.generator = generator
        self.params = dict(params)
        self._process: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()  # one request in flight on the pipes

    def __call__(self, answer: str, entry: Mapping[str, Any]) -> float:
        """The generator's score; TimeoutError past ``SCORE_TIMEOUT_S``, RuntimeError if it raised."""
        with self._lock:
            try:
                if self._process is None:
                    self._process = self._start()
                status, value = self._request(self._process, (answer, dict(entry)), SCORE_TIMEOUT_S)
            except BaseException:
                self.close()
                raise
        if status != "ok":
            raise RuntimeError(f"score_answer raised {value}")
        return float(value)

    def close(self) -> None:
        """Stop the child (the next call starts a new one)."""
        process, self._process = self._process, None
        if process is not None:
            process.kill()
            process.wait()
            for stream in (process.stdin, process.stdout):
                if stream is not None:
                    stream.close()

    def _start(self) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [sys.executable, "-c", _VERIFIER_PROGRAM], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        self._process = process  # so that close() stops it if it does not come up
        self._request(process, (self.generator, self.params), VERIFIER_START_TIMEOUT_S)
        return process

    @staticmethod
    def _request(process: subprocess.Popen[bytes], message: object, timeout_s: float) -> tuple[str, Any]:
        assert process.stdin is not None and process.stdout is not None
        pickle.dump(message, process.stdin)
        process.stdin.flush()
        readable, _, _ = select.select([process.stdout], [], [], timeout_s)
        if not readable:
            raise TimeoutError(f"no reply within {timeout_s:g} s")
        line = process.stdout.readline()
        if not line:
            raise EOFError("the scoring process exited")
        reply = json.loads(line)
        if not (isinstance(reply, list) and len(reply) == 2 and reply[0] in ("ok", "error")):
            raise RuntimeError(f"the scoring process replied {line[:200]!r}")
        return reply[0], reply[1]

    def __getstate__(self) -> dict[str, Any]:  # a copied task starts its own child
        return {"generator": self.generator, "params": self.params}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.generator, self.params = state["generator"], state["params"]
        self._process = None
        self._lock = threading.Lock()


class ReasoningGymTask:
    """Problems from one reasoning-gym generator, answered inside ``<answer></answer>`` tags."""

    name = "reasoning_gym"
    # A completion cut at the stop string may lack the closing tag; ``score`` accepts it the same.
    stop_strings: tuple[str, ...] = (_CLOSE_TAG,)

    def __init__(
        self,
        *,
        generator: str,
        params: Mapping[str, Any] | None = None,
        instruction: str = DEFAULT_INSTRUCTION,
        system_prompt: str | None = None,
    ) -> None:
        self.generator = _check_generator(generator)
        self.params = _check_params(self.generator, {} if params is None else params)
        if not isinstance(instruction, str):
            raise ValueError(f"instruction must be a string, got {instruction!r}")
        if system_prompt is not None and (not isinstance(system_prompt, str) or not system_prompt.strip()):
            raise ValueError(f"system_prompt must be a non-empty string or absent, got {system_prompt!r}")
        self.instruction = instruction
        self.system_prompt = system_prompt
        # Validates the params now rather than at the first draw.
        _create(self.generator, self.params, seed=0, size=1)
        self._verify = _Verifier(self.generator, self.params)

    def problems(self, split: Split, count: int, seed: int) -> list[Problem]:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        want_eval = split == "eval"
        max_draws = MAX_DRAWS_PER_PROBLEM * count + PATIENCE_DRAWS
        seen: set[str] = set()
        problems: list[Problem] = []
        draws = draws_since_new = chunk = 0
        while len(problems) < count and draws_since_new < PATIENCE_DRAWS and draws < max_draws:
            dataset = _create(
                self.generator, self.params, _chunk_seed(self.generator, split, seed, chunk), CHUNK_SIZE
            )
            chunk += 1
            for index in range(CHUNK_SIZE):
                try:
                    entry = dataset[index]
                except IndexError:  # a generator that ran out of items (word_ladder) ends its chunk
                    draws_since_new += CHUNK_SIZE - index
                    draws += CHUNK_SIZE - index
                    break
                draws += 1
                draws_since_new += 1
                question = str(entry["question"])
                if question in seen or _is_eval(question) != want_eval:
                    continue
                seen.add(question)
                draws_since_new = 0
                problems.append(self._problem(question, entry))
                if len(problems) == count:
                    break
        if len(problems) < count:
            logger.warning(
                "reasoning_gym %s %s: found %d distinct %s problems after %d draws, fewer than the %d "
                "asked for; widen the generator's params for more",
                self.generator,
                self.params,
                len(problems),
                split,
                draws,
                count,
            )
        return problems

    def _problem(self, question: str, entry: dict[str, Any]) -> Problem:
        text = f"{question.rstrip()}\n\n{self.instruction}" if self.instruction else question
        system = () if self.system_prompt is None else (Message("system", self.system_prompt),)
        messages = (*system, Message("user", text))
        return Problem(
            problem_id=f"{self.generator}-{_digest(question).hex()}",
            prompt=text,
            answer="" if entry["answer"] is None else str(entry["answer"]),  # None: any valid solution
            messages=messages,
            data={"generator": self.generator, "entry": entry},
        )

    def score(self, problem: Problem, completion: str) -> Score:
        """The generator's verdict on the last ``<answer>`` tag; ``no_answer`` without one."""
        answer = extract_answer(completion)
        if answer is None:
            return Score(0.0, "no_answer")
        entry = problem.data.get("entry")
        if not isinstance(entry, Mapping):
            logger.debug("reasoning_gym: problem %s carries no generator entry", problem.problem_id)
            return Score(0.0, "unparsable")
        try:
            reward = self._verify(answer, entry)
        except RuntimeError as error:  # the verifier choked on the answer text
            logger.debug("reasoning_gym %s: problem %s: %s", self.generator, problem.problem_id, error)
            return Score(0.0, "unparsable")
        except Exception as error:  # a stuck verifier (killed) or a child that died or did not start
            logger.warning(
                "reasoning_gym %s: problem %s: verifier failed (%r) on answer %.200r",
                self.generator,
                problem.problem_id,
                error,
                answer,
            )
            return Score(0.0, "unparsable")
        if math.isnan(reward):
            return Score(0.0, "unparsable")
        if reward >= 1.0:
            return Score(1.0, "correct")
        return Score(max(reward, 0.0), "wrong")

    def reference_completion(self, problem: Problem) -> str:
        """The answer in the tag format, so a warm-start learns at least how to answer."""
        entry = problem.data.get("entry")
        if isinstance(entry, Mapping) and entry.get("answer") is None:
            raise ValueError(
                f"reasoning-gym generator {self.generator!r} gives no reference answer (its verifier "
                "accepts any valid solution), so it cannot warm-start the embedded model: give a model "
                "directory (model.path)"
            )
        return f"{_OPEN_TAG}{problem.answer}{_CLOSE_TAG}"
