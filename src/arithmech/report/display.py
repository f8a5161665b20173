"""Numbers formatted for people: the findings page, the claims scorecard and the generated docs all write
their numbers through these functions, so the same quantity reads the same everywhere.

Every function returns "" for a missing value (None or NaN), so a table cell with nothing to say stays empty.
Torch-free and pandas-light: plain floats in, strings out.

Digits that are float noise are not printed. A model's outputs differ in their last bits between CPUs (another
matrix-product kernel sums in another order), and a statistic built on them moves with them: an interval's end
in its fourth digit, a count over bootstrap resamples by one resample, a small difference of two KLs in its
second significant digit (docs/performance.md, Reproducibility). So the generated docs print an estimate with
a resampled interval at the interval's precision (`estimate`, `bounds`: two significant digits of its width or
of its larger end, whichever are fewer; the resampling's own error is larger than the digits dropped), a share
of resamples in whole percent (`resampled_share`) and a small value in nats with one significant digit
(`nats`). A value that sits on a rounding boundary can still print differently on another machine; these
rules make that rare, not impossible.
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
# Per metric: the factor an effect is shown at and the unit after it
EFFECT_UNITS = {"relative_logit": (100.0, "%"), "prob_change": (100.0, " points"), "logit_diff": (1.0, "")}


def effect(value, metric: str = "relative_logit", low=None, high=None) -> str:
    """A patching effect: a relative logit change (fraction) in percent, -0.01311 -> "-1.31%"; a
    probability change in percentage points; a logit difference as a number of logits. With its interval's
    ends, at the interval's precision (`estimate`): -0.0422 in [-0.0612, -0.0266] -> "-4.2%"."""
    if missing(value):
        return ""
    scale, unit = EFFECT_UNITS[metric]
    if interval_decimals(low, high, scale) is not None:
        return estimate(value, low, high, scale=scale, suffix=unit)
    if metric == "logit_diff":
        return significant(value, 3)
    text = share(value, EFFECT_DECIMALS)
    return text if metric == "relative_logit" else text.replace("%", " points")


def effect_bounds(low, high, metric: str = "relative_logit") -> str:
    """A patching effect's interval "[-6.1%, -2.7%]" at its own precision (`bounds`); a zero width at
    `effect`'s usual digits."""
    scale, unit = EFFECT_UNITS[metric]
    return bounds(low, high, scale=scale, suffix="%" if unit == "%" else "", fallback=lambda v: effect(v, metric))


def resampled_share(fraction) -> str:
    """How often bootstrap resamples select a node: whole percent (one resample more or less moves a decimal),
    and "100%" or "0%" only when every or no resample did: 0.904 -> "90%", 0.998 -> "> 99%", 0.003 -> "< 1%"."""
    if missing(fraction):
        return ""
    value = 100 * float(fraction)
    if 99 < value < 100:
        return "> 99%"
    if 0 < value < 1:
        return "< 1%"
    return f"{round(value):.0f}%"


# Significant digits an interval's ends and its estimate are printed to, at most (`interval_decimals`)
INTERVAL_DIGITS = 2


def interval_decimals(low, high, scale: float = 1.0, digits: int = INTERVAL_DIGITS) -> int | None:
    """The decimals an interval [low, high] x `scale` and its estimate are printed to: those at which its width
    has `digits` significant digits, or its larger end (in size) has, whichever are fewer (at least 0):
    [-16.57, -5.76] -> 0, [-4.41, 2.93] -> 1, [9.84, 12.74] -> 0, [-0.31, -0.23] -> 2. None for a missing,
    infinite or zero width (nothing to take the precision from)."""
    if missing(low) or missing(high):
        return None
    low, high = float(low) * scale, float(high) * scale
    width, size = abs(high - low), max(abs(low), abs(high))
    if not math.isfinite(width) or width == 0:
        return None
    return max(0, digits - 1 - math.floor(math.log10(max(width, size))))


def _at(value, decimals: int | None, fallback, scale: float, sign: bool, suffix: str, end: bool = False) -> str:
    if missing(value):
        return ""
    if decimals is None:
        return fallback(value)
    value = float(value) * scale
    if end and value != 0 and round(value, decimals) == 0:  # an end keeps its side of 0: [-0.1, 37], not [0, 37]
        decimals = -math.floor(math.log10(abs(value)))
    return number(value, decimals, sign) + suffix


def _two_digits(scale: float, sign: bool, suffix: str):
    """The fallback of `bounds` and `estimate`: the scaled value at two significant digits, then `suffix`."""
    def fmt(v) -> str:
        value = float(v) * scale
        decimals = 1 if value == 0 else max(0, 1 - math.floor(math.log10(abs(value))))
        return number(value, decimals, sign) + suffix
    return fmt


def bounds(low, high, *, scale: float = 1.0, sign: bool = False, suffix: str = "", fallback=None,
           digits: int = INTERVAL_DIGITS) -> str:
    """A resampled interval "[a, b]" (values x `scale`, each end followed by `suffix`), both ends at
    `interval_decimals`: [-16.57, -5.76] -> "[-17, -6]", [-0.0166, -0.0116] with scale 100 -> "[-1.7, -1.2]"; an
    end that would read 0 gets its first significant digit, so the side of 0 stays visible: [-0.1, 36.6] ->
    "[-0.1, 37]".
    A zero width prints each end with `fallback` (a function of the unscaled value, unit included; default: the
    scaled value at two significant digits, then `suffix`)."""
    if missing(low) or missing(high):
        return ""
    decimals = interval_decimals(low, high, scale, digits)
    fallback = fallback or _two_digits(scale, sign, suffix)
    ends = [_at(v, decimals, fallback, scale, sign, suffix, end=True) for v in (low, high)]
    return f"[{ends[0]}, {ends[1]}]"


def estimate(value, low, high, *, scale: float = 1.0, sign: bool = False, suffix: str = "", fallback=None,
             digits: int = INTERVAL_DIGITS) -> str:
    """An estimate at the precision of its interval (`bounds`): -0.1162 in [-0.1658, -0.0576] with scale 100
    -> "-12"; without an interval (or a zero width), `fallback` of the unscaled value (unit included; default: the
    scaled value at two significant digits, then `suffix`)."""
    return _at(value, interval_decimals(low, high, scale, digits), fallback or _two_digits(scale, sign, suffix), scale,
               sign, suffix)


def nats(value) -> str:
    """A KL divergence or NLL difference in nats (no unit): 2 significant digits, and below 0.01 in size one
    significant digit in scientific notation, as such small values are differences of near-equal sums:
    0.0123 -> "0.012", -0.000955 -> "-1e-3", 0 -> "0"."""
    if missing(value):
        return ""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    if abs(value) >= 0.01:
        return significant(value, 2)
    mantissa, exponent = f"{value:.0e}".split("e")
    return f"{mantissa}e{int(exponent)}"


def interval(low, high, fmt=number) -> str:
    """An interval "[a, b]", each end formatted by `fmt` (a function of one value); "" if either is absent."""
    if missing(low) or missing(high):
        return ""
    return f"[{fmt(low)}, {fmt(high)}]"


# The units of the claims table (arithmech.report.claims): how a value without an interval reads.
UNIT_FORMATS = {
    "percent": lambda v: percent(v),
    "points": lambda v: points(v),
    "ratio": lambda v: ratio(v),
    "count": lambda v: count(v),
    "nats": lambda v: f"{nats(v)} nats" if not missing(v) else "",
    "cosine": lambda v: number(v, 2),
    "effect": lambda v: effect(v),
}
# Units whose value and interval ends read at the interval's precision (`estimate`, `bounds`): (scale, sign shown
# on positives, unit text after the value); an effect is a fraction shown in percent.
RESAMPLED_UNITS = {"percent": (1.0, False, "%"), "points": (1.0, True, " points"), "effect": (100.0, False, "%"),
                   "nats": (1.0, False, " nats")}
# An interval's ends without the unit's words, so "[1.2, 3.4]" follows "2.3 points" instead of repeating them: the
# units above without a width to take the precision from (a zero-width interval), and the others
INTERVAL_FORMATS = {
    "percent": lambda v: number(v, 1), "points": lambda v: number(v, 1, sign=True), "ratio": lambda v: number(v, 1),
    "count": lambda v: count(v), "nats": lambda v: nats(v), "cosine": lambda v: number(v, 2),
    "effect": lambda v: number(100 * float(v), EFFECT_DECIMALS),
}


def value_in_unit(value, unit: str) -> str:
    """`value` in one of the claims table's units; an unknown unit gets three significant digits."""
    return UNIT_FORMATS.get(unit, lambda v: significant(v, 3))(value)


def measured(value, low, high, unit: str, n=None) -> str:
    """A measured value with its interval and sample size: "2.5% [1.9, 3.1], n = 1,200"; "-41 points [-55,
    -28], n = 120" (a value with an interval in percent, points, effect or nats reads at the interval's
    precision, `estimate`)."""
    if unit in RESAMPLED_UNITS and interval_decimals(low, high, RESAMPLED_UNITS[unit][0]) is not None:
        scale, sign, suffix = RESAMPLED_UNITS[unit]
        parts = [f"{estimate(value, low, high, scale=scale, sign=sign)}{suffix}" if not missing(value) else "",
                 bounds(low, high, scale=scale, sign=sign)]
    else:
        parts = [value_in_unit(value, unit)]
        parts.append(interval(low, high, INTERVAL_FORMATS.get(unit, lambda v: significant(v, 3))))
    text = " ".join(p for p in parts if p)
    if not missing(n):
        text = f"{text}, n = {count(n)}" if text else f"n = {count(n)}"
    return text
