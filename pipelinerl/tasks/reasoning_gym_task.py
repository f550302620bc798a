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
completion cut there may lack the closing tag; it is scored the same. The answer then passes the
generator's grammar (``reasoning_gym_answers.py``): several scorers evaluate their answer with
``eval`` or sympy's ``parse_expr``, so a completion could otherwise run code, forge its reply or
read the scorer's variables. Text outside the grammar is ``unparsable`` with reward 0; accepted text
goes, in its canonical form, to the generator's own ``score_answer``, which gives the reward: 1.0
is ``correct``; anything less is ``wrong`` with the generator's partial credit as the reward (e.g.
``gsm_symbolic`` gives 0.01 for a wrong number).

Every scorer runs in the scoring sandbox (``sandbox.py``): a supervisor process imports the
generator, and each answer is scored in a fresh evaluator forked from it, confined (no network,
read-only file system, the user ``nobody``, limits, a system-call filter) and killed at
``SCORE_TIMEOUT_S`` (``unparsable``); its reply travels on a pipe of its own, so no answer can
decide another's score. A generator the audit does not cover (registered by the user, or new in
another reasoning-gym version) is refused when the task is built unless the option
``allow_unsafe_scorer = true`` accepts that its raw answers reach its scorer (still sandboxed).
Refusals are counted in ``ReasoningGymTask.refusals`` by reason.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import importlib.metadata
import logging
import math
from collections import Counter
from collections.abc import Mapping
from typing import Any

from pipelinerl.tasks import reasoning_gym_answers
from pipelinerl.tasks.answer_grammar import GrammarError
from pipelinerl.tasks.base import Message, Problem, Score, Split
from pipelinerl.tasks.sandbox import Handler, Sandbox

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
# Starting the sandbox's supervisor imports reasoning-gym (about 3 s on an idle machine).
VERIFIER_START_TIMEOUT_S = 120.0
# Reference answers (and as many wrong ones) the scorer is warmed up on (``sandbox.Handler``).
_WARM_UP_SAMPLES = 3
# The option that lets an unaudited generator's raw answers reach its scorer (sandboxed).
UNSAFE_OPTION = "allow_unsafe_scorer"
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


def _check_audited(generator: str, params: Mapping[str, Any], allow_unsafe: object) -> bool:
    if not isinstance(allow_unsafe, bool):
        raise ValueError(f"{UNSAFE_OPTION} must be true or false, got {allow_unsafe!r}")
    names = [generator]
    if generator == reasoning_gym_answers.COMPOSITE:
        names += reasoning_gym_answers.composite_members(params)
    unaudited = [name for name in names if not reasoning_gym_answers.is_audited(name)]
    if unaudited and not allow_unsafe:
        raise ValueError(
            f"reasoning-gym generator {', '.join(map(repr, unaudited))} has a scorer nobody audited "
            f"(the audit covers reasoning-gym {reasoning_gym_answers.AUDITED_VERSION}'s generators): it "
            "may evaluate answer text as code, which the policy would learn to exploit, so it is refused; "
            f"set task option {UNSAFE_OPTION} = true to accept that its raw answers reach its scorer "
            "(inside the scoring sandbox: no network, read-only files, unprivileged, killed at the timeout)"
        )
    installed = _installed_version()
    if installed != reasoning_gym_answers.AUDITED_VERSION and installed not in _version_warned:
        _version_warned.add(installed)
        logger.warning(
            "reasoning-gym %s is installed but the audit of its scorers read %s: a scorer that changed "
            "may evaluate raw answers (still inside the scoring sandbox)",
            installed,
            reasoning_gym_answers.AUDITED_VERSION,
        )
    return allow_unsafe


_version_warned: set[str] = set()


def _installed_version() -> str:
    try:
        return importlib.metadata.version("reasoning-gym")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def sandboxed_scorer(args: tuple[str, dict[str, Any]]) -> Handler:
    """The sandbox's setup (run in its supervisor): ``generator``'s scorer as a function of
    ``(answer, entry)``, warmed up on reference answers and wrong ones (``sandbox.Handler``)."""
    generator, params = args
    dataset = reasoning_gym.create_dataset(generator, seed=0, size=1, **params)

    def score(request: tuple[str | None, dict[str, Any]]) -> float:
        answer, entry = request
        return float(dataset.score_answer(answer, entry))

    warm_up: list[tuple[str | None, dict[str, Any]]] = []
    with contextlib.suppress(Exception):  # a generator that runs dry (word_ladder) warms up on fewer
        for entry in reasoning_gym.create_dataset(generator, seed=1, size=_WARM_UP_SAMPLES, **params):
            warm_up.append((None if entry["answer"] is None else str(entry["answer"]), entry))
    return Handler(score, (*warm_up, *(("0", entry) for _, entry in warm_up)))


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
        allow_unsafe_scorer: bool = False,
    ) -> None:
        self.generator = _check_generator(generator)
        self.params = _check_params(self.generator, {} if params is None else params)
        self.allow_unsafe_scorer = _check_audited(self.generator, self.params, allow_unsafe_scorer)
        if not isinstance(instruction, str):
            raise ValueError(f"instruction must be a string, got {instruction!r}")
        if system_prompt is not None and (not isinstance(system_prompt, str) or not system_prompt.strip()):
            raise ValueError(f"system_prompt must be a non-empty string or absent, got {system_prompt!r}")
        self.instruction = instruction
        self.system_prompt = system_prompt
        # Validates the params now rather than at the first draw.
        _create(self.generator, self.params, seed=0, size=1)
        self._verify = Sandbox(
            f"{__name__}:sandboxed_scorer",
            (self.generator, self.params),
            name=f"reasoning_gym {self.generator}",
            start_timeout_s=VERIFIER_START_TIMEOUT_S,
        )
        # Answers refused, by reason: grammar (outside it), error (the scorer raised), timeout,
        # crashed (a limit ended the evaluator), refused (its reply broke the protocol), failed
        # (the sandbox itself), nan (a NaN reward).
        self.refusals: Counter[str] = Counter()

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
            text = reasoning_gym_answers.scorer_text(
                self.generator, answer, entry, self.params, self.allow_unsafe_scorer
            )
        except GrammarError as error:
            self.refusals["grammar"] += 1
            logger.debug("reasoning_gym %s: problem %s: %s", self.generator, problem.problem_id, error)
            return Score(0.0, "unparsable")
        outcome = self._verify.call((text, dict(entry)), SCORE_TIMEOUT_S)
        value = outcome.value
        if outcome.status != "ok" or isinstance(value, bool) or not isinstance(value, int | float):
            reason = outcome.status if outcome.status != "ok" else "refused"
            self.refusals[reason] += 1
            log = logger.debug if reason == "error" else logger.warning  # a scorer choking on text is normal
            log(
                "reasoning_gym %s: problem %s: %s (%s) on answer %.200r",
                self.generator,
                problem.problem_id,
                reason,
                outcome.detail or f"value {value!r}",
                answer,
            )
            return Score(0.0, "unparsable")
        reward = float(value)
        if math.isnan(reward):
            self.refusals["nan"] += 1
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
