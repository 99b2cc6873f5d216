"""The text table the bench commands print their rows as."""
from __future__ import annotations


def table(rows: list[dict]) -> str:
    """Rows of one shape (the first row's keys are the columns), right-aligned, floats to 4
    significant digits."""
    keys = list(rows[0])
    cells = [[f"{r[k]:.4g}" if isinstance(r[k], float) else str(r[k]) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.rjust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
