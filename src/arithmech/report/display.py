"""Numbers formatted for people: the findings page, the claims scorecard and the generated docs all write
their numbers through these functions, so the same quantity reads the same everywhere.

Every function returns "" for a missing value (None or NaN), so a table cell with nothing to say stays empty.
Torch-free and pandas-light: plain floats in, strings out.
"""

from __future__ import annotations

import math


def missing(value) -> bool:
    """Whether `value` is absent: None, NaN or pandas' NA."""
    if value is None:
        return True
    try:
        return bool(value != value)  # NaN and pd.NA are not equal to themselves
    except TypeError:  # pd.NA's comparison is ambiguous
        return True


def number(value, decimals: int = 1, sign: bool = False) -> str:
    """A plain decimal: 12.345 -> "12.3"; with `sign`, positives get a "+" (differences)."""
    if missing(value):
        return ""
    value = float(value)
    if round(value, decimals) == 0:
        return f"{0:.{decimals}f}"  # neither "-0.0" nor "+0.0": no direction to show
    return f"{value:+.{decimals}f}" if sign else f"{value:.{decimals}f}"


def percent(value, decimals: int = 1, sign: bool = False) -> str:
    """A value already in percent: 12.5 -> "12.5%"."""
    text = number(value, decimals, sign)
    return f"{text}%" if text else ""


def share(fraction, decimals: int = 1, sign: bool = False) -> str:
    """A fraction as a percentage: 0.125 -> "12.5%"."""
    return "" if missing(fraction) else percent(100 * float(fraction), decimals, sign)


def points(value, decimals: int = 1) -> str:
    """A difference of percentages, in percentage points: 3.25 -> "+3.2 points"."""
    text = number(value, decimals, sign=True)
    return f"{text} points" if text else ""


def significant(value, digits: int = 2) -> str:
    """`value` to `digits` significant digits, never in scientific notation: 0.0423 -> "0.042",
    0.5 -> "0.50", 1234 -> "1,200"."""
    if missing(value):
        return ""
    value = float(value)
    if value == 0 or math.isinf(value):
        return f"{value:.{digits - 1}f}" if value == 0 else str(value)
    rounded = float(f"{value:.{digits}g}")  # round first: 0.0999 -> 0.10, not 0.100
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(rounded))))
    return f"{rounded:,.{decimals}f}"


def p_value(p) -> str:
    """A p-value: two significant digits, and "< 0.001" below that (a smaller one only says "very small")."""
    if missing(p):
        return ""
    return "< 0.001" if float(p) < 0.001 else significant(p, 2)


def count(value) -> str:
    """A whole number with thousands separators: 1179648 -> "1,179,648"."""
    return "" if missing(value) else f"{round(float(value)):,}"


def ratio(value, decimals: int = 1) -> str:
    """A ratio: 3.29 -> "3.3x"."""
    text = number(value, decimals)
    return f"{text}x" if text else ""


# How each patching metric's effect reads. relative_logit and prob_change are fractions (of the answer
# logit, of probability); on small models their effects are around 1%, so two decimals keep them apart.
EFFECT_DECIMALS = 2


def effect(value, metric: str = "relative_logit") -> str:
    """A patching effect: a relative logit change (fraction) in percent, -0.01311 -> "-1.31%"; a
    probability change in percentage points; a logit difference as a number of logits."""
    if missing(value):
        return ""
    if metric == "logit_diff":
        return significant(value, 3)
    text = share(value, EFFECT_DECIMALS)
    return text if metric == "relative_logit" else text.replace("%", " points")


def interval(low, high, fmt=number) -> str:
    """An interval "[a, b]", each end formatted by `fmt` (a function of one value); "" if either is absent."""
    if missing(low) or missing(high):
        return ""
    return f"[{fmt(low)}, {fmt(high)}]"


# The units of the claims table (arithmech.report.verdicts): how a value and its interval's ends read.
UNIT_FORMATS = {
    "percent": lambda v: percent(v),
    "points": lambda v: points(v),
    "ratio": lambda v: ratio(v),
    "count": lambda v: count(v),
    "nats": lambda v: f"{significant(v, 2)} nats" if not missing(v) else "",
    "cosine": lambda v: number(v, 2),
    "effect": lambda v: effect(v),
}
# An interval's ends without the unit's words, so "[1.2, 3.4]" follows "2.3 points" instead of repeating them
INTERVAL_FORMATS = {
    "percent": lambda v: number(v, 1), "points": lambda v: number(v, 1, sign=True), "ratio": lambda v: number(v, 1),
    "count": lambda v: count(v), "nats": lambda v: significant(v, 2), "cosine": lambda v: number(v, 2),
    "effect": lambda v: number(100 * float(v), EFFECT_DECIMALS),
}


def value_in_unit(value, unit: str) -> str:
    """`value` in one of the claims table's units; an unknown unit gets three significant digits."""
    return UNIT_FORMATS.get(unit, lambda v: significant(v, 3))(value)


def measured(value, low, high, unit: str, n=None) -> str:
    """A measured value with its interval and sample size: "12.5% [8.1, 17.0], n = 1,200"."""
    parts = [value_in_unit(value, unit)]
    ends = interval(low, high, INTERVAL_FORMATS.get(unit, lambda v: significant(v, 3)))
    if ends:
        parts.append(ends)
    text = " ".join(p for p in parts if p)
    if not missing(n):
        text = f"{text}, n = {count(n)}" if text else f"n = {count(n)}"
    return text
