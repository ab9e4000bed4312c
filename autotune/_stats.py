"""Student's t intervals, without scipy (it is not in the environment).

A measurement is repeated until its 95% interval is narrow enough (``workload.target_precision``),
and confirmation, goodput and ``show`` all read the same intervals, so the quantile has to be
right at the few degrees of freedom where it matters most (df = 1: 12.706, not 1.96). The t
distribution's CDF is the regularized incomplete beta function, evaluated by its continued
fraction (Lentz's method, as in Numerical Recipes ``betacf``), and the quantile is found by
bisection on that CDF: slow by scipy's standards, exact to 1e-9 and a few microseconds here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


def _betacf(a: float, b: float, x: float) -> float:
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return h


def _betainc(a: float, b: float, x: float) -> float:
    """Regularized incomplete beta I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    front = math.exp(log_front)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df > 0, may be fractional)."""
    tail = 0.5 * _betainc(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t (0 < p < 1), by bisection on :func:`t_cdf`."""
    if not 0.0 < p < 1.0 or df <= 0:
        raise ValueError(f"t_quantile needs 0 < p < 1 and df > 0, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    for _ in range(200):
        mid = 0.5 * (low + high)
        if t_cdf(mid, df) < p:
            low = mid
        else:
            high = mid
        if high - low < 1e-10 * max(1.0, high):
            break
    return 0.5 * (low + high)


@dataclass(frozen=True)
class Interval:
    """A two-sided t interval for the mean of ``n`` samples."""

    mean: float
    low: float
    high: float
    n: int

    @property
    def half_width(self) -> float:
        return (self.high - self.low) / 2.0

    @property
    def relative_half_width(self) -> float:
        """Half-width over |mean|: what ``workload.target_precision`` bounds (inf when unknown)."""
        if self.n < 2 or not math.isfinite(self.half_width):
            return math.inf
        return self.half_width / abs(self.mean) if self.mean else math.inf

    def to_list(self) -> list[float]:
        return [round(self.low, 4), round(self.high, 4), self.n]


def mean_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """Student's t interval for the mean; with one sample the interval is unbounded."""
    n = len(values)
    if n == 0:
        raise ValueError("no samples")
    mean = statistics.fmean(values)
    if n < 2:
        return Interval(mean, -math.inf, math.inf, n)
    sd = statistics.stdev(values)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * sd / math.sqrt(n)
    return Interval(mean, mean - half, mean + half, n)


def positive_interval(values: Sequence[float], confidence: float = 0.95) -> Interval:
    """An interval for a quantity that cannot be negative (a rate, a latency): the t interval
    of the mean of the logs, exponentiated, so it never goes below zero and is as asymmetric as
    the spread of positive figures is (the plain t interval once printed an e2e p50 of
    -1,206 .. 3,573 ms). ``mean`` is the geometric mean. A zero among the values (a log is not
    defined) leaves the plain interval, cut at zero."""
    n = len(values)
    if n == 0:
        raise ValueError("no samples")
    if any(v <= 0 for v in values):
        plain = mean_interval(values, confidence)
        if all(v >= 0 for v in values):
            return Interval(plain.mean, max(0.0, plain.low), plain.high, n)
        return plain
    logs = [math.log(v) for v in values]
    centre = statistics.fmean(logs)
    if n < 2:
        return Interval(math.exp(centre), 0.0, math.inf, n)
    half = t_quantile(0.5 + confidence / 2.0, n - 1) * statistics.stdev(logs) / math.sqrt(n)
    return Interval(math.exp(centre), math.exp(centre - half), math.exp(centre + half), n)
