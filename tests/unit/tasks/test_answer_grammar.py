"""The answer grammars: what they accept and the canonical text they return, and every kind of text
that would run code, read a name, or make a scorer compute for ever, refused without evaluating."""

from __future__ import annotations

import ast

import pytest

from pipelinerl.tasks.answer_grammar import (
    MAX_ANSWER_CHARS,
    MAX_CONSTANT_BITS,
    MAX_EXPONENT,
    MAX_INT_DIGITS,
    MAX_LITERAL_DEPTH,
    MAX_NODES,
    ExpressionRules,
    GrammarError,
    expression,
    literal,
    tokens,
)

# Text that runs code, reaches a scorer's variables or the interpreter, in the forms an attacker tries.
CODE = [
    "__import__('os').system('touch /tmp/owned')",
    "open('/tmp/owned', 'w').write('x')",
    "__import__('socket').create_connection(('127.0.0.1', 80))",
    "exec('import os')",
    "eval('1')",
    "(lambda: 1)()",
    "[c for c in ().__class__.__base__.__subclasses__()]",
    "().__class__",
    "print('x')",
    "entry",
    "oracle_answer",
    "self",
    "answer",
    "__builtins__",
    "f'{1}'",
    "x if 1 else 2",
    "(x := 1)",
    "{'a': 1}",
    "{1, 2}",
    "b'x'",
    "1j",
    "not 1",
    "1 < 2",
    "1 and 2",
    "[1][0]",
    "...",
    "None",
    "True",
]

POLY = ExpressionRules(names=frozenset({"x", "y"}), power=True)
CALCULUS = ExpressionRules(
    names=frozenset({"x", "C", "pi", "E"}),
    functions=frozenset({"sin", "cos", "exp", "log", "sqrt"}),
    power=True,
    symbolic_exponents=True,
)
ARITHMETIC = ExpressionRules(floats=False)


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("[[1, 2], [3, 4]]", "[[1, 2], [3, 4]]"),
        ("[ 'A', \"B\" ]", "['A', 'B']"),
        ("1, 2, 3", "(1, 2, 3)"),
        ("(-1, +2.5)", "(-1, 2.5)"),
        ("'ABC'", "'ABC'"),
        ("[]", "[]"),
        ("  [0]  ", "[0]"),
    ],
)
def test_literals_are_rewritten_as_the_repr_of_their_value(text: str, canonical: str) -> None:
    assert literal(text) == canonical
    assert ast.literal_eval(canonical) == ast.literal_eval(text.strip())


@pytest.mark.parametrize("text", [*CODE, "1 + 2", "-x", "-'a'", "[1, x]", "2 ** 3"])
def test_literals_refuse_everything_else(text: str) -> None:
    with pytest.raises(GrammarError):
        literal(text)


def test_literal_limits() -> None:
    deep = "[" * MAX_LITERAL_DEPTH + "]" * MAX_LITERAL_DEPTH
    assert literal(deep) == deep
    with pytest.raises(GrammarError, match="nested deeper"):
        literal("[" + deep + "]")
    with pytest.raises(GrammarError, match="digits"):
        literal("9" * (MAX_INT_DIGITS + 1))
    with pytest.raises(GrammarError, match="not finite"):
        literal("1e999")
    with pytest.raises(GrammarError, match="characters"):
        literal("[" + "0," * MAX_ANSWER_CHARS + "]")
    with pytest.raises(GrammarError, match="parts"):
        literal("[" + "0," * MAX_NODES + "]")
    with pytest.raises(GrammarError, match="not a literal"):
        literal("[" * 500)  # the parser's own nesting limit, reported, not raised


@pytest.mark.parametrize(
    ("text", "rules", "canonical"),
    [
        ("82 + 20 + 67 - 50", ARITHMETIC, "82 + 20 + 67 - 50"),
        ("(4*8)-6-2", ARITHMETIC, "4 * 8 - 6 - 2"),
        ("-(3 / 4)", ARITHMETIC, "-(3 / 4)"),
        ("1638*x**6 + 189*x**4", POLY, "1638 * x ** 6 + 189 * x ** 4"),
        ("-2*x**9 + 7*y**8 - 2*x", POLY, "-2 * x ** 9 + 7 * y ** 8 - 2 * x"),
        ("2*(4*x + 2)**(3/2)/3 + C", CALCULUS, "2 * (4 * x + 2) ** (3 / 2) / 3 + C"),
        ("x*sin(3*x) + sqrt(1 - 9*x**2)/3 + C", CALCULUS, "x * sin(3 * x) + sqrt(1 - 9 * x ** 2) / 3 + C"),
        ("E**x + pi", CALCULUS, "E ** x + pi"),
        ("exp(-6*x - 10) + C", CALCULUS, "exp(-6 * x - 10) + C"),
    ],
)
def test_expressions_are_rewritten_from_their_tree(text: str, rules: ExpressionRules, canonical: str) -> None:
    assert expression(text, rules) == canonical
    assert ast.dump(ast.parse(canonical, mode="eval")) == ast.dump(ast.parse(text, mode="eval"))


@pytest.mark.parametrize("text", CODE)
@pytest.mark.parametrize("rules", [ARITHMETIC, POLY, CALCULUS], ids=["arithmetic", "poly", "calculus"])
def test_expressions_refuse_code_and_unknown_names(text: str, rules: ExpressionRules) -> None:
    with pytest.raises(GrammarError):
        expression(text, rules)


@pytest.mark.parametrize(
    ("text", "rules", "message"),
    [
        ("2 ** 3", ARITHMETIC, r"'\*\*' is not allowed"),
        ("1.5 + 1", ARITHMETIC, "only integers"),
        ("y + 1", CALCULUS, r"name 'y' is not allowed \(allowed: C, E, pi, x\)"),
        ("tan(x)", CALCULUS, r"call of 'tan' is not allowed \(functions: cos, exp, log, sin, sqrt\)"),
        ("sin(x, 2)", CALCULUS, "exactly one plain argument"),
        ("sin(x=1)", CALCULUS, "exactly one plain argument"),
        ("sin(*x)", CALCULUS, "exactly one plain argument"),
        ("x.real", CALCULUS, "attribute 'real'"),
        ("x ** y", POLY, "exponent must be a number"),
        ("x ^ 2", POLY, "BitXor"),
        ("x % 2", POLY, "Mod"),
        ("1 / 0", ARITHMETIC, "division by zero"),
        ("1 / (2 - 2)", ARITHMETIC, "division by zero"),
        ("0 ** -1", POLY, "division by zero"),
        ("x ** sqrt(2)", CALCULUS, "rational"),
    ],
)
def test_expression_refusals_say_what_was_refused(text: str, rules: ExpressionRules, message: str) -> None:
    with pytest.raises(GrammarError, match=message):
        expression(text, rules)


@pytest.mark.parametrize(
    "text",
    [
        "9**9**9**9",  # the tower that kept a verifier busy for ever
        "2 ** (2 ** 20)",
        f"x ** {MAX_EXPONENT + 1}",
        f"x ** (1 / {MAX_EXPONENT + 1})",
        f"(2 ** 64) ** {MAX_CONSTANT_BITS // 64 + 1}",
        f"{'9' * MAX_INT_DIGITS} ** 50",
        f"{'9' * (MAX_INT_DIGITS + 1)}",
        "(" * 300 + "1" + ")" * 300,
        "+".join(["x"] * MAX_NODES),
    ],
)
def test_expressions_that_would_compute_for_ever_are_refused(text: str) -> None:
    with pytest.raises(GrammarError):
        expression(text, CALCULUS)


def test_bounded_powers_pass() -> None:
    assert expression(f"x ** {MAX_EXPONENT}", POLY) == f"x ** {MAX_EXPONENT}"
    assert expression("2 ** 10 * x", POLY) == "2 ** 10 * x"
    assert expression("(2 ** 64) ** 60", POLY) == "(2 ** 64) ** 60"


def test_tokens_pass_unchanged_or_are_refused() -> None:
    matrix = "2 3 4\n1 2 3\n0 1 2"
    assert tokens(matrix, r"[0-9]+") == matrix
    assert tokens("_ Q\nQ _", r"[_Q]") == "_ Q\nQ _"
    assert tokens("EEBCEDE", r"[A-Z]+") == "EEBCEDE"
    for text, token in [("1 2 x", r"[0-9]+"), ("", r"[0-9]+"), ("QQ", r"[_Q]"), ("oracle_answer", r"[A-Z]+")]:
        with pytest.raises(GrammarError, match="tokens of the form"):
            tokens(text, token)
    with pytest.raises(GrammarError, match="characters"):
        tokens("1 " * MAX_ANSWER_CHARS, r"[0-9]+")
