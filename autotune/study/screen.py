"""Short screens before long measurements: one round decides whether a config is worth more.

A launch is expensive, and measuring it to full precision is too: rounds go on until the
objective's interval is within ``workload.target_precision`` (often 5-10 rounds on a noisy
machine). Most configs a search tries are not close to the best one, and one round says so.
So every searched config is first measured for one round, inside the same launch (the server
is still up), and it goes on to full precision only if that round's interval overlaps the
leader's:

* **the leader** is the best verified trial of the study so far (COMPLETE, gate passed, every
  constraint held, a search, retry or baseline trial), read from the study when the first round
  ends, so that a parallel worker's newer leader counts. Its interval is the 95% t interval of
  the mean of its rounds' values (``bench.repeats``), as ``show`` prints it.
* **this trial's interval** after one round cannot come from its own spread (one value has
  none). It borrows the leader's round-to-round spread: the 95% prediction interval of one new
  round, ``value * (1 +- t(n-1) * cv * sqrt(1 + 1/n))`` with the leader's coefficient of variation
  ``cv`` over its ``n`` rounds, and never narrower than +-:data:`MIN_HALF_WIDTH`. The noise of a
  round is the machine's and the workload's more than the config's, so the leader's spread is
  the best estimate there is; the floor keeps a quiet leader from screening a close config.
* **clearly slower** means the two intervals do not overlap and this one lies on the worse
  side. Non-overlap of two 95% intervals is a stricter test than a 95% test of the difference,
  so a config is screened only when its loss is beyond doubt; anything else is measured on.

A screened trial ends ``screened``: PRUNED, correct (it passed the gate and the check under
load), with its one round's metrics and this screen's record (``names.SCREEN``), never best,
never exported, never a confirmation candidate. No leader (the baseline itself, a leader
measured for fewer than two rounds), a multi-objective study, an objective no round measures
(``goodput``) or a workload that stops after one round anyway: nothing is screened.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from autotune import names
from autotune._stats import positive_interval, t_quantile
from autotune.spec.model import ObjectiveSpec
from autotune.study.results import is_verified_feasible

#: the narrowest a one-round interval is ever taken to be, relative to its value (+-5%): a
#: config within a few percent of the leader is always measured to full precision
MIN_HALF_WIDTH = 0.05
#: the roles whose trials a screen may stop (never the baseline, a confirmation, an ablation)
SCREENED_ROLES = (names.SEARCH, names.RETRY)


@dataclass(frozen=True)
class Leader:
    """The best verified trial so far and its rounds' values of the objective metric."""

    number: int
    rounds: tuple[float, ...]

    @property
    def interval(self) -> tuple[float, float]:
        iv = positive_interval(list(self.rounds))
        return iv.low, iv.high

    def one_round_half_width(self) -> float:
        """Relative half-width of the 95% prediction interval of one new round at its noise."""
        n = len(self.rounds)
        mean = statistics.fmean(self.rounds)
        cv = statistics.stdev(self.rounds) / mean if mean > 0 else 0.0
        return max(MIN_HALF_WIDTH, t_quantile(0.975, n - 1) * cv * math.sqrt(1.0 + 1.0 / n))


@dataclass(frozen=True)
class ScreenResult:
    """One screen's decision, stored as the trial's ``screen`` attribute."""

    metric: str
    value: float
    interval: tuple[float, float]
    leader: int
    leader_interval: tuple[float, float]
    screened: bool

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["interval"] = [round(v, 4) for v in self.interval]
        data["leader_interval"] = [round(v, 4) for v in self.leader_interval]
        data["value"] = round(self.value, 4)
        data["verdict"] = names.SCREENED if self.screened else "measured on"
        return data

    def detail(self) -> str:
        """The reason a reader is shown: this round's interval against the leader's."""
        low, high = self.interval
        lead_low, lead_high = self.leader_interval
        return (
            f"one round: {self.metric} {self.value:.4g} (interval {low:.4g} .. {high:.4g}), "
            f"clearly worse than the leader, trial {self.leader} "
            f"({lead_low:.4g} .. {lead_high:.4g}); not measured on"
        )


def leader_of(trials: Sequence[FrozenTrial], metric: str, sign: float) -> Leader | None:
    """The best verified search-role trial with at least two rounds of ``metric``, or None."""
    best: tuple[float, Leader] | None = None
    for trial in trials:
        if not is_verified_feasible(trial):
            continue
        if trial.user_attrs.get(names.ROLE, names.SEARCH) not in names.SEARCH_ROLES:
            continue
        repeats = (trial.user_attrs.get(names.BENCH) or {}).get("repeats") or []
        rounds = tuple(float(r[metric]) for r in repeats if metric in r)
        if len(rounds) < 2 or len(rounds) != len(repeats):
            continue
        score = sign * trial.values[0]
        if best is None or score > best[0]:
            best = (score, Leader(trial.number, rounds))
    return None if best is None else best[1]


def judge(value: float, leader: Leader, metric: str, sign: float) -> ScreenResult:
    """This round's interval against the leader's (see the module docstring)."""
    half = leader.one_round_half_width() * abs(value)
    low, high = value - half, value + half
    lead_low, lead_high = leader.interval
    worse = high < lead_low if sign > 0 else low > lead_high
    return ScreenResult(metric, value, (low, high), leader.number, (lead_low, lead_high), worse)


class Screen:
    """The benchmark's ``stop_rule`` for one trial: after the first round, stop when the
    config is clearly worse than the study's leader. ``result`` holds the decision (None when
    nothing was judged)."""

    def __init__(self, study: optuna.Study | None, metric: str, direction: str) -> None:
        self.study = study
        self.metric = metric
        self.sign = 1.0 if direction == "maximize" else -1.0
        self.result: ScreenResult | None = None

    def __call__(self, index: int, rounds: Sequence[dict[str, float]]) -> str | None:
        if index != 0 or self.study is None or self.metric not in rounds[0]:
            return None
        leader = leader_of(self.study.get_trials(deepcopy=False), self.metric, self.sign)
        if leader is None:
            return None
        self.result = judge(rounds[0][self.metric], leader, self.metric, self.sign)
        return names.SCREENED if self.result.screened else None


def screen_for(study: optuna.Study | None, objective: ObjectiveSpec, role: str) -> Screen | None:
    """The screen for a trial of ``role``, or None where nothing may be screened."""
    if study is None or role not in SCREENED_ROLES or len(objective.metrics) != 1:
        return None
    metric = objective.metrics[0]
    if names.split_level(metric)[0] == "goodput":
        return None  # measured after the rounds, never by one of them
    return Screen(study, metric, objective.directions[0])
