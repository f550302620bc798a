"""Strict grammars for answer text: what a scorer that evaluates may be given, decided without
evaluating anything (pure: no I/O, no imports of scorers).

A completion is written by the policy, which is optimised to find reward; a scorer that hands its
text to ``eval`` or sympy's ``parse_expr`` lets it run code, read the scorer's local variables or
hang the process. Each grammar here accepts a small language, parses the text with Python's
``ast`` (which builds a tree and runs nothing), walks the tree against an allow-list and returns a
canonical text rebuilt from the accepted tree, so a scorer only ever sees text this module wrote:

* ``literal``: numbers, strings, lists and tuples (no names, calls, operators but a sign), with
  limits on size and nesting; the canonical text is the ``repr`` of the value.
* ``expression``: arithmetic over numeric constants and allowed names: ``+ - * /``, ``**`` when
  allowed, unary signs, parentheses, calls of allowed functions with positional arguments; integer
  digits, exponents and the size of every constant part are bounded, so neither Python nor sympy can
  be made to compute a huge number; the canonical text is ``ast.unparse`` of the tree.
* ``tokens``: whitespace-separated tokens of one regular expression (a matrix of digits, a board
  of ``_`` and ``Q``); returned unchanged.

Anything else raises ``GrammarError`` (a ``ValueError``) saying what was refused.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from fractions import Fraction

# Longest answer text any grammar reads: a 20 x 20 matrix as a list literal is about 2,000
# characters; the reference answers of the expression generators are under 200.
MAX_ANSWER_CHARS = 10_000
# Nodes of a parsed tree: a 20 x 20 matrix literal has about 440.
MAX_NODES = 2_000
# Nesting of lists and tuples: a matrix is two deep; a list of boards three.
MAX_LITERAL_DEPTH = 4
# Digits of one integer constant: reference answers have at most a dozen.
MAX_INT_DIGITS = 100
# Largest exponent (numerator and denominator of a constant exponent): polynomial degrees here are
# below 50; a bigger exponent only serves to make sympy or CPython compute for ever.
MAX_EXPONENT = 1_000
# Bits of any constant sub-expression's numerator and denominator (about 1,200 decimal digits):
# constant folding below never computes a bigger number, and neither can the scorer.
MAX_CONSTANT_BITS = 4_096


class GrammarError(ValueError):
    """The answer is not in the grammar; the message says which part was refused."""


@dataclass(frozen=True)
class ExpressionRules:
    """What an ``expression`` may contain besides numbers, ``+ - * /``, signs and parentheses."""

    names: frozenset[str] = frozenset()  # variables and constants (``x``, ``C``, ``pi``)
    functions: frozenset[str] = frozenset()  # called with one argument (``sin``, ``sqrt``)
    power: bool = False  # ``**`` allowed
    symbolic_exponents: bool = False  # an exponent may contain names (``E**x``); else constant
    floats: bool = True  # decimal constants allowed, else integers only


def _parse(text: str, what: str) -> ast.expr:
    if len(text) > MAX_ANSWER_CHARS:
        raise GrammarError(f"{what} of {len(text)} characters, over the {MAX_ANSWER_CHARS} allowed")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as error:
        raise GrammarError(f"not a {what}: {type(error).__name__}: {error}") from None
    nodes = sum(1 for _ in ast.walk(tree))
    if nodes > MAX_NODES:
        raise GrammarError(f"{what} of {nodes} parts, over the {MAX_NODES} allowed")
    return tree.body


def _number(node: ast.Constant, floats: bool) -> int | float:
    value = node.value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise GrammarError(f"constant {value!r} is not a number")
    if isinstance(value, float):
        if not floats:
            raise GrammarError(f"decimal {value!r} where only integers are allowed")
        if not math.isfinite(value):
            raise GrammarError(f"number {value!r} is not finite")
    elif len(str(abs(value))) > MAX_INT_DIGITS:
        raise GrammarError(f"integer of more than {MAX_INT_DIGITS} digits")
    return value


# --- literal ---------------------------------------------------------------------------------


def literal(text: str) -> str:
    """The canonical text of a literal answer (numbers, strings, lists, tuples): ``repr`` of it."""
    return repr(_literal_value(_parse(text, "literal"), depth=0))


def _literal_value(node: ast.expr, depth: int) -> object:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, str):
            return node.value
        return _number(node, floats=True)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        if not isinstance(node.operand, ast.Constant) or isinstance(node.operand.value, str):
            raise GrammarError("a sign applies only to a number in a literal")
        value = _number(node.operand, floats=True)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.List | ast.Tuple):
        if depth >= MAX_LITERAL_DEPTH:
            raise GrammarError(f"lists nested deeper than {MAX_LITERAL_DEPTH}")
        items = [_literal_value(item, depth + 1) for item in node.elts]
        return items if isinstance(node, ast.List) else tuple(items)
    raise GrammarError(f"{_describe(node)} is not allowed in a literal (numbers, strings, lists, tuples)")


# --- expression ------------------------------------------------------------------------------

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}


def expression(text: str, rules: ExpressionRules) -> str:
    """The canonical text of an arithmetic answer under ``rules`` (``ast.unparse`` of it)."""
    node = _parse(text, "expression")
    _Checker(rules).check(node)
    return ast.unparse(node)


class _Checker:
    """Walks an expression tree; ``check`` returns the value of a constant part (a Fraction, or
    None when it is not rational, e.g. ``sqrt(2)``) and raises on anything outside the rules."""

    _NOT_CONSTANT = object()

    def __init__(self, rules: ExpressionRules) -> None:
        self.rules = rules

    def check(self, node: ast.expr) -> object:
        """A Fraction (rational constant), None (irrational constant) or _NOT_CONSTANT."""
        rules = self.rules
        if isinstance(node, ast.Constant):
            return Fraction(_number(node, rules.floats))
        if isinstance(node, ast.Name):
            if node.id not in rules.names:
                allowed = ", ".join(sorted(rules.names)) or "none"
                raise GrammarError(f"name {node.id!r} is not allowed (allowed: {allowed})")
            return self._NOT_CONSTANT
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            value = self.check(node.operand)
            return -value if isinstance(value, Fraction) and isinstance(node.op, ast.USub) else value
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
            return self._binary(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        raise GrammarError(f"{_describe(node)} is not allowed in an expression")

    def _binary(self, node: ast.BinOp) -> object:
        if isinstance(node.op, ast.Pow) and not self.rules.power:
            raise GrammarError("'**' is not allowed in this answer")
        left, right = self.check(node.left), self.check(node.right)
        if isinstance(node.op, ast.Pow):
            return self._power(left, right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise GrammarError("division by zero")
        if not (isinstance(left, Fraction) and isinstance(right, Fraction)):
            return left if left is self._NOT_CONSTANT else right if right is self._NOT_CONSTANT else None
        value = {ast.Add: left + right, ast.Sub: left - right, ast.Mult: left * right}.get(type(node.op))
        return _bounded(left / right if value is None else value)

    def _power(self, base: object, exponent: object) -> object:
        if exponent is self._NOT_CONSTANT:
            if not self.rules.symbolic_exponents:
                raise GrammarError("an exponent must be a number here")
            return self._NOT_CONSTANT
        if exponent is None:
            raise GrammarError("an exponent must be a rational number")
        assert isinstance(exponent, Fraction)
        if abs(exponent.numerator) > MAX_EXPONENT or exponent.denominator > MAX_EXPONENT:
            raise GrammarError(f"exponent {exponent} is beyond ±{MAX_EXPONENT}")
        if not isinstance(base, Fraction):
            return base
        if base == 0 and exponent < 0:
            raise GrammarError("division by zero")
        bits = max(base.numerator.bit_length(), base.denominator.bit_length())
        if bits * abs(exponent.numerator) > MAX_CONSTANT_BITS:
            raise GrammarError(f"a power of more than {MAX_CONSTANT_BITS} bits")
        if exponent.denominator != 1:
            return None  # an irrational constant, bounded by the check above
        return _bounded(base**exponent.numerator)

    def _call(self, node: ast.Call) -> object:
        if not isinstance(node.func, ast.Name) or node.func.id not in self.rules.functions:
            allowed = ", ".join(sorted(self.rules.functions)) or "none"
            called = repr(node.func.id) if isinstance(node.func, ast.Name) else _describe(node.func)
            raise GrammarError(f"call of {called} is not allowed (functions: {allowed})")
        if node.keywords or len(node.args) != 1 or isinstance(node.args[0], ast.Starred):
            raise GrammarError(f"{node.func.id} takes exactly one plain argument")
        argument = self.check(node.args[0])
        return self._NOT_CONSTANT if argument is self._NOT_CONSTANT else None


def _bounded(value: Fraction) -> Fraction:
    if max(value.numerator.bit_length(), value.denominator.bit_length()) > MAX_CONSTANT_BITS:
        raise GrammarError(f"a constant of more than {MAX_CONSTANT_BITS} bits")
    return value


# --- tokens ----------------------------------------------------------------------------------


def tokens(text: str, token: str) -> str:
    """``text`` unchanged if it is one or more whitespace-separated tokens each matching ``token``
    (a regular expression), e.g. the rows of a matrix."""
    if len(text) > MAX_ANSWER_CHARS:
        raise GrammarError(f"answer of {len(text)} characters, over the {MAX_ANSWER_CHARS} allowed")
    words = text.split()
    pattern = re.compile(token)
    if not words or not all(pattern.fullmatch(word) for word in words):
        raise GrammarError(f"not whitespace-separated tokens of the form {token!r}")
    return text


def _describe(node: ast.AST) -> str:
    if isinstance(node, ast.Name):
        return f"name {node.id!r}"
    if isinstance(node, ast.Attribute):
        return f"attribute {node.attr!r}"
    if isinstance(node, ast.BinOp | ast.UnaryOp | ast.BoolOp | ast.Compare):
        operator = getattr(node, "op", None) or getattr(node, "ops", [None])[0]
        return f"operator {type(operator).__name__}"
    return type(node).__name__
