"""Which answer text may reach each reasoning-gym generator's scorer: the audit of reasoning-gym
0.1.25's ``score_answer`` methods and the grammar put in front of every one that evaluates (pure:
no I/O, and reasoning-gym itself is not imported).

The audit (reading each ``score_answer`` and the helpers it calls, and running each on sample
answers under an audit hook that reports ``compile``/``exec``) found these evaluating the answer:

* ``eval(answer)``: ``binary_matrix``, ``spiral_matrix``, ``string_insertion``, ``n_queens``. They
  first compare the raw text with the reference, then ``eval`` it as a Python list. Accepted:
  whitespace-separated tokens of the reference's own form (digits; capital letters; ``_``/``Q``),
  passed unchanged (``eval`` of such text is a syntax error, a number, or a name none of these
  scorers can see, checked by the unit tests against the installed package), or a literal
  (numbers, strings, lists, tuples), passed as the ``repr`` of its value.
* sympy's ``parse_expr(answer)`` (which ends in ``eval`` and reaches Python's builtins):
  ``countdown``, ``puzzle24`` (integers with ``+ - * /``), ``simple_integration``,
  ``intermediate_integration`` (the variable, ``C``, ``pi``, ``E``, elementary functions, ``**``),
  ``polynomial_multiplication`` (the problem's variables, ``**`` with a numeric exponent). Passed as
  the grammar's canonical text.

Not evaluating the answer (raw text passes): every other generator, including
``bitwise_arithmetic`` (``eval`` of its own problem, ``int(answer, 0)`` of the answer) and
``number_sorting`` (``eval`` of its own reference, ``json.loads`` of the answer). ``composite``
uses the policy of the generator each entry came from.

A generator missing from this audit (registered by the user, or new in another reasoning-gym
version) is refused by name unless the task's ``allow_unsafe_scorer`` option accepts the risk: its
raw answers then reach its scorer, inside the sandbox (``sandbox.py``) only. The sandbox confines
every generator's scorer in any case; the grammars keep a completion from running code at all.

Deliberately refused, although the reference answers contain it: ``Integral(...)`` in the
integration generators (reasoning-gym's reference when sympy found no closed form). An answer that
restates the integral is scored correct by differentiation without solving anything.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pipelinerl.tasks.answer_grammar import ExpressionRules, GrammarError, expression, literal, tokens

# The reasoning-gym release this audit read (``importlib.metadata.version("reasoning-gym")``).
AUDITED_VERSION = "0.1.25"

Policy = Callable[[str, Mapping[str, Any], Mapping[str, Any]], str]

# Functions an integration answer may call: those in reasoning-gym's reference answers (sin, cos,
# exp, log, sqrt, asin, atan) and their usual companions; each takes one argument.
INTEGRATION_FUNCTIONS = frozenset(
    {
        "sin", "cos", "tan", "cot", "sec", "csc", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
        "acosh", "atanh", "exp", "log", "sqrt"
    }
)
# sympy's constants an integration answer may name besides its variable and the constant ``C``.
INTEGRATION_CONSTANTS = frozenset({"C", "pi", "E"})
# polynomial_multiplication's default ``variables`` parameter (its config class).
POLYNOMIAL_DEFAULT_VARIABLES = ("x", "y", "z")


def _raw(answer: str, entry: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    return answer


def _tokens_or_literal(token: str) -> Policy:
    def policy(answer: str, entry: Mapping[str, Any], params: Mapping[str, Any]) -> str:
        try:
            return tokens(answer, token)
        except GrammarError:
            pass
        try:
            return literal(answer)
        except GrammarError as error:
            raise GrammarError(f"neither tokens of the form {token!r} nor a literal ({error})") from None

    return policy


_ARITHMETIC = ExpressionRules(floats=False)


def _arithmetic(answer: str, entry: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    return expression(answer, _ARITHMETIC)


def _integral(answer: str, entry: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    variable = entry["metadata"]["variable"]
    rules = ExpressionRules(
        names=INTEGRATION_CONSTANTS | {variable},
        functions=INTEGRATION_FUNCTIONS,
        power=True,
        symbolic_exponents=True,
    )
    return expression(answer, rules)


def _polynomial(answer: str, entry: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    names = {*entry["metadata"].get("variables", ()), *params.get("variables", POLYNOMIAL_DEFAULT_VARIABLES)}
    return expression(answer, ExpressionRules(names=frozenset(map(str, names)), power=True))


# The token of each ``eval`` scorer's plain answers: the form of its reference (the rows of a matrix
# of digits; the letters A to E; a board of ``_`` and ``Q``), which contains no name it can see.
PLAIN_TOKENS = {
    "binary_matrix": r"[0-9]+",
    "spiral_matrix": r"[0-9]+",
    "string_insertion": r"[A-Z]+",
    "n_queens": r"[_Q]",
}
EVALUATING: dict[str, Policy] = {
    **{generator: _tokens_or_literal(token) for generator, token in PLAIN_TOKENS.items()},
    "countdown": _arithmetic,
    "puzzle24": _arithmetic,
    "simple_integration": _integral,
    "intermediate_integration": _integral,
    "polynomial_multiplication": _polynomial,
}

# Every other generator of reasoning-gym 0.1.25: its scorer does not evaluate the answer.
NOT_EVALUATING = frozenset(
    {
        "ab", "acre", "advanced_geometry", "aiw", "arc_1d", "arc_agi", "base_conversion",
        "basic_arithmetic", "bf", "binary_alternation", "bitwise_arithmetic", "boxnet", "caesar_cipher",
        "calendar_arithmetic", "chain_sum", "circuit_logic", "codeio", "coin_flip", "color_cube_rotation",
        "complex_arithmetic", "count_bits", "count_primes", "course_schedule", "cryptarithm",
        "decimal_arithmetic", "decimal_chain_sum", "dice", "emoji_mystery", "family_relationships",
        "figlet_font", "fraction_simplification", "futoshiki", "game_of_life", "game_of_life_halting",
        "gcd", "graph_color", "group_anagrams", "gsm_symbolic", "isomorphic_strings", "jugs", "kakurasu",
        "knight_swap", "knights_knaves", "largest_island", "lcm", "leg_counting", "letter_counting",
        "letter_jumble", "list_functions", "mahjong_puzzle", "manipulate_matrix", "maze", "mini_sudoku",
        "modulo_grid", "needle_haystack", "number_filtering", "number_format", "number_sequence",
        "number_sorting", "palindrome_generation", "palindrome_partitioning", "path_star",
        "polynomial_equations", "pool_matrix", "power_function", "prime_factorization", "products",
        "propositional_logic", "quantum_lock", "ransom_note", "rearc", "rectangle_count", "rotate_matrix",
        "rotten_oranges", "rubiks_cube", "rush_hour", "self_reference", "sentence_reordering",
        "shortest_path", "simple_equations", "simple_geometry", "sokoban", "spell_backward",
        "string_manipulation", "string_splitting", "string_synthesis", "sudoku", "survo", "syllogism",
        "time_intervals", "tower_of_hanoi", "tsumego", "word_ladder", "word_sequence_reversal",
        "word_sorting", "zebra_puzzles"
    }
)
COMPOSITE = "composite"


def is_audited(generator: str) -> bool:
    """Whether the audit covers ``generator`` (``composite`` counts: its members are checked)."""
    return generator in EVALUATING or generator in NOT_EVALUATING or generator == COMPOSITE


def composite_members(params: Mapping[str, Any]) -> list[str]:
    """The generator names a ``composite`` generator's ``datasets`` parameter lists."""
    names = []
    for spec in params.get("datasets") or ():
        name = spec.get("name") if isinstance(spec, Mapping) else getattr(spec, "name", None)
        names.append(str(name))
    return names


def scorer_text(
    generator: str, answer: str, entry: Mapping[str, Any], params: Mapping[str, Any], allow_unsafe: bool
) -> str:
    """The text ``generator``'s scorer may be given for ``answer``; GrammarError if none.

    ``entry`` is the problem's reasoning-gym entry (its metadata names the variables of an
    expression); ``params`` the generator's parameters. An unaudited generator's raw answer passes
    only with ``allow_unsafe``."""
    if generator == COMPOSITE:
        member = entry.get("metadata", {}).get("source_dataset")
        if not isinstance(member, str) or member == COMPOSITE:
            raise GrammarError(f"composite entry from an unknown generator {member!r}")
        return scorer_text(member, answer, entry, {}, allow_unsafe)
    policy = EVALUATING.get(generator)
    if policy is not None:
        try:
            return policy(answer, entry, params)
        except (KeyError, TypeError, AttributeError) as error:  # an entry without the expected metadata
            raise GrammarError(f"{generator} entry lacks what its grammar needs ({error!r})") from None
    if generator in NOT_EVALUATING or allow_unsafe:
        return answer
    raise GrammarError(f"generator {generator!r} is not audited and unsafe scorers are not allowed")
