"""The generator of the math task's shipped problem set (``pipelinerl/tasks/data/math.jsonl``).

``python -m pipelinerl.tasks.math_data`` rewrites the file; the same seed always writes the same
bytes (a unit test checks that the shipped file is what the generator writes). Every problem is
made here from random numbers, none is copied from a dataset. A record is
``{"problem", "solution", "answer", "topic"}``: the solution works the problem in a few short steps
and ends with ``\\boxed{answer}``.

Topics (each drawn in turn until ``PROBLEM_COUNT`` distinct problems): fraction sums, products
and quotients, linear equations (one- and two-sided), a two-equation system, percentages,
percent-off prices, decimal products, powers (negative bases, negative exponents, fractions),
remainders, order of operations, means, and word problems (change, rates, sharing). Answers
come as integers, negative numbers, fractions (``\\frac{3}{4}``, ``-\\frac{7}{3}``) and decimals
(``12.5``), so the checker's equivalence (``0.5`` = ``1/2`` = ``\\frac{1}{2}``) matters.

Three more topics, by name only, are sums worked column by column (``COLUMN_TOPICS``), which a tiny
model can learn: an integer sum, a sum of fractions with one denominator (boxed unreduced, checked
against the reference in lowest terms) and an equation ``x - b = c``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from fractions import Fraction
from math import lcm
from pathlib import Path

from pipelinerl.tasks.arithmetic import column_steps

SHIPPED_PATH = Path(__file__).resolve().parent / "data" / "math.jsonl"
SEED = 20261122
PROBLEM_COUNT = 400

NAMES = ("Ana", "Ben", "Chloe", "Dev", "Elif", "Femi", "Gus", "Hana", "Ivan", "Jia", "Kofi", "Lena")
ITEMS = (("a notebook", "notebooks"), ("a pen", "pens"), ("an apple", "apples"), ("a ticket", "tickets"))

Record = dict[str, str]


def fraction_latex(value: Fraction) -> str:
    """``value`` in LaTeX: ``5``, ``-5``, ``\\frac{3}{4}`` or ``-\\frac{3}{4}``."""
    if value.denominator == 1:
        return str(value.numerator)
    sign = "-" if value < 0 else ""
    return f"{sign}\\frac{{{abs(value.numerator)}}}{{{value.denominator}}}"


def decimal_text(value: Fraction) -> str:
    """``value`` as an exact decimal with no trailing zeros (``12.5``, ``-0.75``, ``3``); its
    denominator must divide a power of ten."""
    digits = 0
    while (value * 10**digits).denominator != 1:
        digits += 1
        if digits > 12:
            raise ValueError(f"{value} has no finite decimal expansion")
    whole, fraction = divmod(int(abs(value) * 10**digits), 10**digits)
    text = f"{whole}.{fraction:0{digits}d}" if digits else str(whole)
    return ("-" if value < 0 else "") + text


def _record(topic: str, problem: str, steps: list[str], answer: str, boxed: str | None = None) -> Record:
    """``boxed``: the form the solution ends with when it is not ``answer``'s (an unreduced fraction)."""
    solution = "\n".join([*steps, f"The answer is \\boxed{{{boxed or answer}}}"])
    return {"problem": problem, "solution": solution, "answer": answer, "topic": topic}


def _signed(value: Fraction | int) -> str:
    """A term after a binary operator: negative values in parentheses."""
    text = fraction_latex(Fraction(value))
    return f"({text})" if value < 0 else text


def _x_term(coefficient: int) -> str:
    """``coefficient * x`` as written: ``3x``, ``x``, ``-x``."""
    return {1: "x", -1: "-x"}.get(coefficient, f"{coefficient}x")


def _fraction(rng: random.Random) -> Fraction:
    """A positive fraction that is not a whole number, at most 2."""
    while True:
        denominator = rng.randint(2, 12)
        value = Fraction(rng.randint(1, 2 * denominator), denominator)
        if value.denominator != 1:
            return value


def fraction_sum(rng: random.Random) -> Record:
    a, b = _fraction(rng), _fraction(rng)
    subtract = rng.random() < 0.5
    result = a - b if subtract else a + b
    sign = "-" if subtract else "+"
    common = lcm(a.denominator, b.denominator)
    left, right = a.numerator * (common // a.denominator), b.numerator * (common // b.denominator)
    total = left - right if subtract else left + right
    steps = [
        f"The common denominator of {a.denominator} and {b.denominator} is {common}.",
        f"$\\frac{{{left}}}{{{common}}} {sign} \\frac{{{right}}}{{{common}}} "
        f"= \\frac{{{total}}}{{{common}}}$.",
    ]
    if Fraction(total, common).denominator != common:
        steps.append(f"In lowest terms this is ${fraction_latex(result)}$.")
    problem = f"Compute ${fraction_latex(a)} {sign} {fraction_latex(b)}$. Write the answer in lowest terms."
    return _record("fraction_sum", problem, steps, fraction_latex(result))


def fraction_product(rng: random.Random) -> Record:
    a, b = _fraction(rng), _fraction(rng)
    if rng.random() < 0.5:
        a = -a
    divide = rng.random() < 0.5
    if divide:
        result = a / b
        steps = [
            f"Dividing by ${fraction_latex(b)}$ is multiplying by ${fraction_latex(1 / b)}$.",
            f"${fraction_latex(a)} \\times {fraction_latex(1 / b)} = {fraction_latex(result)}$.",
        ]
        problem = (
            f"Compute ${fraction_latex(a)} \\div {fraction_latex(b)}$. Write the answer in lowest terms."
        )
    else:
        result = a * b
        steps = [
            f"Multiply the numerators and the denominators: "
            f"$\\frac{{{a.numerator * b.numerator}}}{{{a.denominator * b.denominator}}}$.",
            f"In lowest terms this is ${fraction_latex(result)}$.",
        ]
        problem = (
            f"Compute ${fraction_latex(a)} \\times {fraction_latex(b)}$. Write the answer in lowest terms."
        )
    return _record("fraction_product", problem, steps, fraction_latex(result))


def linear_equation(rng: random.Random) -> Record:
    a = rng.choice([n for n in range(-12, 13) if n not in (-1, 0, 1)])
    b, c = rng.randint(-40, 40), rng.randint(-40, 40)
    x = Fraction(c - b, a)
    b_text = f"+ {b}" if b >= 0 else f"- {-b}"
    move = f"Subtract {b} from" if b >= 0 else f"Add {-b} to"
    steps = [
        f"{move} both sides: ${a}x = {c - b}$.",
        f"Divide both sides by {a}: $x = {fraction_latex(x)}$.",
    ]
    problem = f"Solve for $x$: ${a}x {b_text} = {c}$."
    return _record("linear_equation", problem, steps, fraction_latex(x))


def two_sided_equation(rng: random.Random) -> Record:
    a, c = rng.sample([n for n in range(-9, 10) if n != 0], 2)
    b, d = rng.randint(-30, 30), rng.randint(-30, 30)
    x = Fraction(d - b, a - c)

    def side(coefficient: int, constant: int) -> str:
        return f"{_x_term(coefficient)} {'+' if constant >= 0 else '-'} {abs(constant)}"

    steps = [
        f"Move the $x$ terms to the left and the numbers to the right: "
        f"${_x_term(a)} {'-' if c > 0 else '+'} {_x_term(abs(c))} = {d} - {_signed(b)}$.",
        f"So ${_x_term(a - c)} = {d - b}$ and $x = {fraction_latex(x)}$.",
    ]
    problem = f"Solve for $x$: ${side(a, b)} = {side(c, d)}$."
    return _record("two_sided_equation", problem, steps, fraction_latex(x))


def linear_system(rng: random.Random) -> Record:
    x, y = Fraction(rng.randint(-20, 20), rng.choice([1, 1, 2])), Fraction(rng.randint(-20, 20))
    total, difference = x + y, x - y
    steps = [
        f"Adding the equations gives $2x = {fraction_latex(total + difference)}$.",
        f"So $x = {fraction_latex(x)}$.",
    ]
    problem = (
        f"If $x + y = {fraction_latex(total)}$ and $x - y = {fraction_latex(difference)}$, "
        "what is the value of $x$?"
    )
    return _record("linear_system", problem, steps, fraction_latex(x))


def percent_of(rng: random.Random) -> Record:
    percent = rng.choice([5, 10, 12, 15, 20, 25, 30, 35, 40, 45, 60, 75, 80, 120, 150])
    whole = rng.randint(2, 400)
    result = Fraction(percent * whole, 100)
    steps = [
        f"{percent}\\% of {whole} is $\\frac{{{percent}}}{{100}} \\times {whole} = {decimal_text(result)}$.",
    ]
    problem = f"What is ${percent}\\%$ of ${whole}$?"
    return _record("percent_of", problem, steps, decimal_text(result))


def what_percent(rng: random.Random) -> Record:
    whole = rng.choice([4, 5, 8, 10, 16, 20, 25, 40, 50, 80, 125, 200])
    part = rng.randint(1, 2 * whole)
    result = Fraction(100 * part, whole)
    steps = [
        f"$\\frac{{{part}}}{{{whole}}} \\times 100 = {decimal_text(result)}$, "
        "so the answer is that many percent."
    ]
    problem = f"${part}$ is what percent of ${whole}$? Give the number of percent."
    return _record("what_percent", problem, steps, decimal_text(result))


def sale_price(rng: random.Random) -> Record:
    name, (item, _) = rng.choice(NAMES), rng.choice(ITEMS)
    price = Fraction(rng.randint(8, 160))
    discount = rng.choice([10, 15, 20, 25, 30, 40, 50])
    saved = price * discount / 100
    result = price - saved
    steps = [
        f"The discount is {discount}\\% of \\${price}, which is \\${decimal_text(saved)}.",
        f"The sale price is ${price} - {decimal_text(saved)} = {decimal_text(result)}$ dollars.",
    ]
    problem = (
        f"{item.capitalize()} costs \\${price}. {name} buys it at {discount}\\% off. "
        f"How many dollars does {name} pay?"
    )
    return _record("sale_price", problem, steps, decimal_text(result))


def decimal_product(rng: random.Random) -> Record:
    a = Fraction(rng.randint(1, 99), rng.choice([10, 100]))
    b = Fraction(rng.randint(1, 40), rng.choice([1, 10]))
    if rng.random() < 0.3:
        a = -a
    result = a * b
    steps = [f"${decimal_text(a)} \\times {decimal_text(b)} = {decimal_text(result)}$."]
    problem = f"Compute ${decimal_text(a)} \\times {decimal_text(b)}$ as a decimal."
    return _record("decimal_product", problem, steps, decimal_text(result))


def power(rng: random.Random) -> Record:
    kind = rng.choice(["negative_base", "negative_exponent", "fraction_base"])
    if kind == "negative_base":
        base, exponent = Fraction(-rng.randint(2, 6)), rng.randint(2, 7)
        result = base**exponent
        parity = "odd" if exponent % 2 else "even"
        steps = [
            f"An {parity} power of a negative number is {'negative' if exponent % 2 else 'positive'}.",
            f"${-base}^{{{exponent}}} = {abs(result)}$, "
            f"so $({base})^{{{exponent}}} = {fraction_latex(result)}$.",
        ]
        problem = f"Compute $({base})^{{{exponent}}}$."
    elif kind == "negative_exponent":
        base, exponent = Fraction(rng.randint(2, 10)), rng.randint(1, 4)
        result = base**-exponent
        steps = [
            f"${base}^{{-{exponent}}} = \\frac{{1}}{{{base}^{{{exponent}}}}} = {fraction_latex(result)}$."
        ]
        problem = f"Compute ${base}^{{-{exponent}}}$ as a fraction."
    else:
        base, exponent = Fraction(rng.randint(1, 5), rng.randint(2, 7)), rng.randint(2, 4)
        base = base if base.denominator != 1 else Fraction(base.numerator, base.numerator + 1)
        result = base**exponent
        steps = [
            f"Raise the numerator and the denominator to the power {exponent}: "
            f"$\\frac{{{base.numerator}^{exponent}}}{{{base.denominator}^{exponent}}} "
            f"= {fraction_latex(result)}$."
        ]
        problem = f"Compute $\\left({fraction_latex(base)}\\right)^{{{exponent}}}$."
    return _record("power", problem, steps, fraction_latex(result))


def remainder(rng: random.Random) -> Record:
    if rng.random() < 0.5:
        number, divisor = rng.randint(100, 99999), rng.randint(3, 40)
        quotient, rest = divmod(number, divisor)
        steps = [f"${number} = {divisor} \\times {quotient} + {rest}$, and $0 \\le {rest} < {divisor}$."]
        problem = f"What is the remainder when ${number}$ is divided by ${divisor}$?"
    else:
        base, exponent, divisor = rng.randint(2, 9), rng.randint(3, 12), rng.randint(3, 13)
        number = base**exponent
        quotient, rest = divmod(number, divisor)
        steps = [
            f"${base}^{{{exponent}}} = {number}$.",
            f"${number} = {divisor} \\times {quotient} + {rest}$.",
        ]
        problem = f"What is the remainder when ${base}^{{{exponent}}}$ is divided by ${divisor}$?"
    return _record("remainder", problem, steps, str(rest))


def order_of_operations(rng: random.Random) -> Record:
    a, b, c = rng.randint(-20, 20), rng.randint(2, 9), rng.randint(-5, 5)
    divisor = rng.randint(2, 6)
    d = divisor * rng.randint(-8, 8)
    square = c * c
    product = b * square
    quotient = d // divisor
    result = a + product - quotient
    steps = [
        f"First the power: ${_signed(c)}^2 = {square}$.",
        f"Then the product and the quotient: ${b} \\times {square} = {product}$ and "
        f"${d} \\div {divisor} = {quotient}$.",
        f"Finally ${a} + {product} - {_signed(quotient)} = {result}$.",
    ]
    problem = f"Compute ${a} + {b} \\times {_signed(c)}^2 - {_signed(d)} \\div {divisor}$."
    return _record("order_of_operations", problem, steps, str(result))


def mean(rng: random.Random) -> Record:
    values = [rng.randint(-10, 60) for _ in range(rng.choice([2, 4, 5, 8]))]
    total = sum(values)
    result = Fraction(total, len(values))
    listed = ", ".join(str(value) for value in values)
    steps = [
        f"The sum is {total} and there are {len(values)} numbers.",
        f"The mean is $\\frac{{{total}}}{{{len(values)}}} = {decimal_text(result)}$.",
    ]
    problem = f"What is the mean of the numbers {listed}? Give the answer as a decimal."
    return _record("mean", problem, steps, decimal_text(result))


def change_word_problem(rng: random.Random) -> Record:
    name, (_, items) = rng.choice(NAMES), rng.choice(ITEMS)
    count, price = rng.randint(2, 9), Fraction(rng.randint(25, 200), 20)  # prices in steps of 5 cents
    cost = count * price
    paid = rng.choice([bill for bill in (20, 50, 100, 200) if bill >= cost])
    change = paid - cost
    steps = [
        f"{count} {items} cost ${count} \\times {decimal_text(price)} = {decimal_text(cost)}$ dollars.",
        f"The change is ${paid} - {decimal_text(cost)} = {decimal_text(change)}$ dollars.",
    ]
    problem = (
        f"{name} buys {count} {items} at \\${float(price):.2f} each and pays with a \\${paid} bill. "
        "How many dollars of change does " + name + " get?"
    )
    return _record("change", problem, steps, decimal_text(change))


def rate_word_problem(rng: random.Random) -> Record:
    name = rng.choice(NAMES)
    if rng.random() < 0.5:
        speed, hours = rng.randint(3, 90), Fraction(rng.randint(1, 12), rng.choice([1, 2, 4]))
        distance = speed * hours
        steps = [
            "Time is distance over speed: "
            f"$\\frac{{{decimal_text(distance)}}}{{{speed}}} = {decimal_text(hours)}$."
        ]
        problem = (
            f"{name} travels {decimal_text(distance)} km at a steady {speed} km per hour. "
            "How many hours does the trip take?"
        )
        return _record("rate", problem, steps, decimal_text(hours))
    pages_per_minute, pages = rng.randint(4, 30), rng.randint(20, 300)
    minutes = Fraction(pages, pages_per_minute)
    steps = [
        f"The printer needs $\\frac{{{pages}}}{{{pages_per_minute}}}$ minutes, "
        f"which is ${fraction_latex(minutes)}$ minutes."
    ]
    problem = (
        f"{name}'s printer prints {pages_per_minute} pages per minute. How many minutes does it take to "
        f"print {pages} pages? Give an exact answer."
    )
    return _record("rate", problem, steps, fraction_latex(minutes))


def sharing_word_problem(rng: random.Random) -> Record:
    first, second = rng.sample(NAMES, 2)
    ratio_a, ratio_b = rng.sample(range(1, 10), 2)
    total = (ratio_a + ratio_b) * rng.randint(2, 30)
    share = Fraction(total * ratio_a, ratio_a + ratio_b)
    steps = [
        f"There are ${ratio_a} + {ratio_b} = {ratio_a + ratio_b}$ equal parts of "
        f"$\\frac{{{total}}}{{{ratio_a + ratio_b}}} = {total // (ratio_a + ratio_b)}$ dollars each.",
        f"{first} gets ${ratio_a} \\times {total // (ratio_a + ratio_b)} = {fraction_latex(share)}$ dollars.",
    ]
    problem = (
        f"{first} and {second} share \\${total} in the ratio {ratio_a}:{ratio_b}. "
        f"How many dollars does {first} get?"
    )
    return _record("sharing", problem, steps, fraction_latex(share))


def _operands(rng: random.Random, max_digits: int) -> tuple[int, int]:
    """Two positive integers, the longer of 1 to ``max_digits`` digits (uniform), the other no longer."""
    longer = rng.randint(1, max_digits)
    shorter = rng.randint(1, longer)
    a = rng.randint(10 ** (longer - 1), 10**longer - 1)
    b = rng.randint(10 ** (shorter - 1), 10**shorter - 1)
    return (a, b) if rng.random() < 0.5 else (b, a)


def _column_sum_steps(a: int, b: int) -> list[str]:
    return ["By columns, right to left:", *column_steps(a, b)]


def column_sum(rng: random.Random) -> Record:
    a, b = _operands(rng, COLUMN_DIGITS)
    return _record("column_sum", f"Compute ${a} + {b}$.", _column_sum_steps(a, b), str(a + b))


def same_denominator_sum(rng: random.Random) -> Record:
    a, b = _operands(rng, 2)
    denominator = rng.randint(2, 19)
    total = Fraction(a + b, denominator)
    unreduced = f"\\frac{{{a + b}}}{{{denominator}}}"
    steps = [
        "One denominator: add the numerators.",
        *_column_sum_steps(a, b),
        f"The sum is ${unreduced}$.",
    ]
    problem = f"Compute $\\frac{{{a}}}{{{denominator}}} + \\frac{{{b}}}{{{denominator}}}$."
    # The solution boxes the unreduced fraction and the reference is in lowest terms: math-verify
    # must find the two equal.
    return _record("same_denominator_sum", problem, steps, fraction_latex(total), boxed=unreduced)


def missing_addend(rng: random.Random) -> Record:
    b, c = _operands(rng, COLUMN_DIGITS)
    steps = [f"Add {b} to both sides: $x = {c} + {b}$.", *_column_sum_steps(c, b)]
    return _record("missing_addend", f"Solve for $x$: $x - {b} = {c}$.", steps, str(b + c))


# The shipped set's topics (``generate``'s default; the shipped file is written from these).
TOPICS: tuple[Callable[[random.Random], Record], ...] = (
    fraction_sum,
    fraction_product,
    linear_equation,
    two_sided_equation,
    linear_system,
    percent_of,
    what_percent,
    sale_price,
    decimal_product,
    power,
    remainder,
    order_of_operations,
    mean,
    change_word_problem,
    rate_word_problem,
    sharing_word_problem,
)

# Topics a small model can learn: sums worked column by column (the arithmetic task's lines) in
# three guises, an integer sum, a fraction sum and an equation. Chosen by name only
# (``generated:<count>:column_sum,same_denominator_sum,missing_addend``).
COLUMN_TOPICS: tuple[Callable[[random.Random], Record], ...] = (
    column_sum,
    same_denominator_sum,
    missing_addend,
)
COLUMN_DIGITS = 4


# Draws of one topic in a row that may repeat earlier problems before the topic counts as spent.
TOPIC_PATIENCE = 200


TOPIC_NAMES: tuple[str, ...] = tuple(topic.__name__ for topic in (*TOPICS, *COLUMN_TOPICS))


def generate(
    count: int = PROBLEM_COUNT, seed: int = SEED, topics: Sequence[str] | None = None
) -> list[Record]:
    """``count`` distinct problems, topics in turn, all determined by ``seed``; ``topics``: only these
    (names from ``TOPIC_NAMES``), else the shipped set's (``TOPICS``).

    A topic whose draws repeat ``TOPIC_PATIENCE`` times in a row has given all it can and is left out
    from then on; ValueError when every topic is spent before ``count``.
    """
    if topics is not None:
        unknown = [name for name in topics if name not in TOPIC_NAMES]
        if unknown or not topics:
            raise ValueError(f"math topics {list(topics)!r}: valid topics are {', '.join(TOPIC_NAMES)}")
    rng = random.Random(seed)
    records: list[Record] = []
    seen: set[str] = set()
    pool = list(TOPICS) if topics is None else [t for t in (*TOPICS, *COLUMN_TOPICS) if t.__name__ in topics]
    turn = repeats = 0
    while len(records) < count:
        if not pool:
            raise ValueError(f"the math generator has {len(records)} distinct problems, fewer than {count}")
        topic = pool[turn % len(pool)]
        record = topic(rng)
        if record["problem"] in seen:
            repeats += 1
            if repeats == TOPIC_PATIENCE:
                pool.remove(topic)
                repeats = 0
            continue
        seen.add(record["problem"])
        records.append(record)
        turn, repeats = turn + 1, 0
    return records


def render(records: list[Record]) -> str:
    """The JSONL text of ``records``, one object a line."""
    return "".join(json.dumps(record, ensure_ascii=False) + "\n" for record in records)


def main() -> None:
    SHIPPED_PATH.parent.mkdir(parents=True, exist_ok=True)
    SHIPPED_PATH.write_text(render(generate()), encoding="utf-8")
    print(f"wrote {PROBLEM_COUNT} problems to {SHIPPED_PATH}")


if __name__ == "__main__":
    main()
