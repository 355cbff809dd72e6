"""Markdown tables and the cells in them, shared by momfmm.report and momfmm.results.

Kept apart from those modules so that none of them imports another just for a table helper
(the import graph is in docs/design.md §8.8). Numbers are the final eval metrics of
docs/metrics.md §3; a group's cell is mean ± sample standard deviation over its members.
"""
import math

import numpy as np

MISSING = "—"


def shortest(value):
    """A number in the shortest form that reads back as the same float: 0.2, not
    0.20000000000000001; whole numbers without a decimal point (3, not 3.0). Python's repr of a
    float is the shortest string that parses back to the same float, which %g (6 digits) and
    %.17g (too many) are not."""
    number = float(value)
    if number.is_integer() and abs(number) < 1e16:
        return str(int(number))
    return repr(number)


def config_value(text):
    """A config value as read from config_ini, for display: numbers in their shortest
    round-trip form ("0.20000000000000001" -> "0.2"), anything else stripped as it is."""
    text = (text or "").strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return shortest(number) if math.isfinite(number) else text


def fmt_value(value, column, digits):
    """One cell: MISSING for None, strings as they are, integers plainly, tokens/s without
    decimals, other floats with `digits` decimals."""
    if value is None:
        return MISSING
    if isinstance(value, str):
        return value
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if not math.isfinite(value):
        return "nan"
    return f"{value:.0f}" if column == "tokens/s" else f"{value:.{digits}f}"


def fmt_group(values, column, digits):
    """One cell for a group: shared value, distinct strings joined by '/', or mean ± std."""
    present = [v for v in values if v is not None]
    if not present:
        return MISSING
    if any(isinstance(v, str) for v in present):
        return "/".join(sorted(set(map(str, present))))
    if all(v == present[0] for v in present):
        return fmt_value(present[0], column, digits)
    arr = np.asarray(present, dtype=float)
    arr = arr[np.isfinite(arr)]
    if len(arr) == 0:
        return "nan"
    mean = fmt_value(float(np.mean(arr)), column, digits)
    std = fmt_value(float(np.std(arr, ddof=1)) if len(arr) > 1 else 0.0, column, digits)
    return f"{mean} ± {std}"


def markdown(header, body):
    """A Markdown table; cells may be any value (str() of it), '|' is escaped."""
    def line(cells):
        return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
    rule = "|" + "|".join("---" for _ in header) + "|"
    return "\n".join([line(header), rule] + [line(cells) for cells in body])
