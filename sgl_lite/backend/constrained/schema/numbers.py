"""Bounded number patterns: integer ranges compiled into regexes, numbers with bounded digits.

An unbounded `[0-9]+` lets a model write digits until the budget runs out; here integers carry
at most INT_MAX_DIGITS digits (int64's 19) unless a range says otherwise, and numbers at most
NUMBER_INT_DIGITS integer and NUMBER_FRAC_DIGITS fraction digits: the bounds of
`sgl_lite.common.regex`, which the `dtype=int|float` / `gen_int` patterns use too. JSON numbers
follow them here (schema_regex.py). Pure functions over integers and strings.
"""

from __future__ import annotations

from fractions import Fraction

from sgl_lite.common.regex import INT_MAX_DIGITS, NUMBER_FRAC_DIGITS, NUMBER_INT_DIGITS

# JSON integers/numbers (no leading zeros, no '+', no exponent: a subset of what JSON allows).
JSON_INT_PATTERN = rf"(0|-?[1-9][0-9]{{0,{INT_MAX_DIGITS - 1}}})"
JSON_NUMBER_PATTERN = (
    rf"-?(0|[1-9][0-9]{{0,{NUMBER_INT_DIGITS - 1}}})(\.[0-9]{{1,{NUMBER_FRAC_DIGITS}}})?"
)


def _same_length(lo: str, hi: str) -> str:
    """Regex for the decimal strings of equal length n between lo and hi (inclusive)."""
    if not lo:
        return ""
    if lo == hi:
        return lo
    rest = len(lo) - 1
    if lo[1:] == "0" * rest and hi[1:] == "9" * rest:
        head = lo[0] if lo[0] == hi[0] else f"[{lo[0]}-{hi[0]}]"
        return head + (f"[0-9]{{{rest}}}" if rest > 1 else "[0-9]" if rest == 1 else "")
    if lo[0] == hi[0]:
        return lo[0] + _same_length(lo[1:], hi[1:])
    parts = [lo[0] + _same_length(lo[1:], "9" * rest)]
    a, b = int(lo[0]) + 1, int(hi[0]) - 1
    if a <= b:
        mid = str(a) if a == b else f"[{a}-{b}]"
        parts.append(mid + (f"[0-9]{{{rest}}}" if rest > 1 else "[0-9]"))
    parts.append(hi[0] + _same_length("0" * rest, hi[1:]))
    return "(" + "|".join(parts) + ")"


def _non_negative_range(lo: int, hi: int) -> str:
    """Regex for the decimal integers lo..hi, 0 <= lo <= hi, without leading zeros."""
    parts = []
    for n in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (n - 1) if n > 1 else 0)
        b = min(hi, 10**n - 1)
        if a <= b:
            parts.append(_same_length(str(a), str(b)))
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def int_range_pattern(lo: int | None, hi: int | None, *, max_digits: int = INT_MAX_DIGITS) -> str:
    """Regex for the JSON integers in [lo, hi] (None = unbounded, then at most `max_digits`
    digits). Raises ValueError if the range is empty."""
    if lo is None and hi is None:
        return rf"(0|-?[1-9][0-9]{{0,{max_digits - 1}}})"
    limit = 10**max_digits - 1
    lo = -limit if lo is None else lo
    hi = limit if hi is None else hi
    if lo > hi:
        raise ValueError(f"empty integer range [{lo}, {hi}]")
    parts = []
    if hi >= 0:
        parts.append(_non_negative_range(max(lo, 0), hi))
    if lo < 0:
        # -n for n in [max(1, -hi), -lo]
        parts.append("-" + _non_negative_range(max(1, -hi), -lo))
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def integer_gaps(excluded: set[int]) -> list[dict[str, int]]:
    """The integers other than `excluded`, as the anyOf branches of bounds between them: for
    {0, 5}, `maximum: -1`, `minimum: 1, maximum: 4`, `minimum: 6` (adjacent values leave no
    branch between them). With nothing excluded, one branch that bounds nothing."""
    values = sorted(excluded)
    if not values:
        return [{}]
    branches: list[dict[str, int]] = [{"maximum": values[0] - 1}]
    for low, high in zip(values, values[1:]):
        if high - low > 1:
            branches.append({"minimum": low + 1, "maximum": high - 1})
    branches.append({"minimum": values[-1] + 1})
    return branches


def number_range_pattern(
    lo: Fraction | None,
    hi: Fraction | None,
    *,
    lo_exclusive: bool = False,
    hi_exclusive: bool = False,
    int_digits: int = NUMBER_INT_DIGITS,
    frac_digits: int = NUMBER_FRAC_DIGITS,
) -> str:
    """Regex for JSON numbers in a range with integer bounds (None = unbounded).

    A number is its integer value (with an optional all-zero fraction) or a value strictly
    between two integers k and k+1; the first set honours exclusive bounds, the open intervals
    are inside [lo, hi] exactly when their integer ends are. Raises ValueError for a bound that
    is not an integer or an empty range.
    """
    if lo is None and hi is None:
        return rf"-?(0|[1-9][0-9]{{0,{int_digits - 1}}})(\.[0-9]{{1,{frac_digits}}})?"
    for bound in (lo, hi):
        if bound is not None and bound.denominator != 1:
            raise ValueError(f"number bounds must be integers, got {float(bound)}")
    limit = 10**int_digits - 1
    a = -limit if lo is None else int(lo)
    b = limit if hi is None else int(hi)
    frac_zero = rf"(\.0{{1,{frac_digits}}})?"
    frac_nonzero = rf"\.[0-9]{{0,{frac_digits - 1}}}[1-9]"
    parts = []
    ia, ib = a + int(lo_exclusive), b - int(hi_exclusive)
    if ia <= ib:
        parts.append(_group_alt(int_range_pattern(ia, ib, max_digits=int_digits)) + frac_zero)
    # k.f (0 < f < 1) with k >= 0 lies in (k, k+1): needs a <= k and k + 1 <= b.
    pos_lo, pos_hi = max(a, 0), b - 1
    if pos_lo <= pos_hi:
        parts.append(_group_alt(_non_negative_range(pos_lo, pos_hi)) + frac_nonzero)
    # -k.f lies in (-(k+1), -k): needs a <= -(k+1) and -k <= b.
    neg_lo, neg_hi = max(0, -b), -a - 1
    if neg_lo <= neg_hi:
        parts.append("-" + _group_alt(_non_negative_range(neg_lo, neg_hi)) + frac_nonzero)
    if not parts:
        raise ValueError(f"empty number range between {a} and {b}")
    return parts[0] if len(parts) == 1 else "(" + "|".join(parts) + ")"


def _group_alt(regex: str) -> str:
    return f"({regex})"
