"""Statistics shared by a trial's repeats (trial.metrics) and the champion's verdict (results.select)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np


def as_array(samples: Sequence[float], what: str) -> np.ndarray:
    """`samples` as a 1-d float array; ValueError (naming `what`) when empty or not all finite."""
    values = np.asarray(list(samples), dtype=float)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"{what} needs at least one sample, but got {len(values)}")
    if not np.all(np.isfinite(values)):
        raise ValueError(f"{what} must be finite numbers, but got {list(samples)!r}")
    return values


def _apply_rows(stat: Callable[..., float], boot: np.ndarray) -> np.ndarray:
    try:
        out = np.asarray(stat(boot, axis=1), dtype=float)
        if out.shape == (boot.shape[0],):
            return out
    except TypeError:
        pass
    return np.asarray([stat(row) for row in boot], dtype=float)


def bootstrap_ci(
    samples: Sequence[float],
    *,
    stat: Callable[..., float] = np.median,
    n_boot: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> tuple[float, float]:
    """Percentile bootstrap interval of `stat` over `samples` (same seed -> same interval).

    With a single sample the interval collapses to that sample.
    """
    values = as_array(samples, "bootstrap_ci")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie in (0, 1), but got {level}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be >= 1, but got {n_boot}")
    if values.size == 1:
        v = float(stat(values))
        return v, v
    rng = np.random.default_rng(seed)
    boot = values[rng.integers(0, values.size, size=(n_boot, values.size))]
    stats = _apply_rows(stat, boot)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(stats, [alpha, 1.0 - alpha])
    return float(low), float(high)
