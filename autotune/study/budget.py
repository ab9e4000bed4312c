"""``--trials N`` is the run's launches in all: the baseline, the search and the confirmation.

A launch is the expensive unit (at GLM-5 scale, minutes of loading weights, compiling and
capturing graphs), so the number the user types is the number of servers the run starts.
:func:`plan_budget` splits it before the first launch: the confirmation (``analysis/
confirm.py``) gets at most a fifth of the budget by default, in whole rounds (one round is the
baseline and each candidate once); the search gets the rest. Rounds come before candidates: a
second candidate is raced only where each variant still gets
:data:`ROUNDS_PER_CANDIDATE` rounds, because what a confirmation can prove is set by its
rounds (with 5 % launch-to-launch noise, two rounds settle only a gain above about 20 %, four
about 9 %, six about 7 %: a t interval at few degrees of freedom), and at most
:data:`PLAN_MAX_ROUNDS` rounds are planned. When two rounds of even one candidate do not fit
(below about ``--trials 20``) the run does not confirm and says so: its best is then an
unconfirmed measurement, and the verdict is that the baseline stands. ``--confirm-repeats R``
asks for R rounds explicitly; a budget that cannot hold them is bad input (exit 2). The race
may stop before the plan's launches are spent, and a candidate it drops leaves its launches
to more rounds of the others (``confirm.round_fits``).

A resumed study counts the launches it already made (:func:`launches_made`), so running the
same command again continues the budget instead of spending it twice.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from optuna.trial import FrozenTrial, TrialState

from autotune import names
from autotune.errors import SpecError

#: fewest confirmation rounds: one round cannot say how much a config's runs vary
MIN_ROUNDS = 2
#: rounds ``autotune confirm`` measures by default (``--repeats``)
MAX_ROUNDS = 4
#: most rounds a run's default plan reserves (the race usually stops before): eight settle a
#: gain of about 6 % at 5 % launch-to-launch noise
PLAN_MAX_ROUNDS = 8
#: rounds each variant must still get before the plan races one more candidate
ROUNDS_PER_CANDIDATE = 4
#: the default confirmation gets at most 1/CONFIRM_SHARE of the launches
CONFIRM_SHARE = 5
#: roles of the trials ``autotune run`` launches (ablation and compare are other commands)
RUN_ROLES = (*names.SEARCH_ROLES, names.CONFIRM)
#: outcomes that started no server, or that the loop retries without counting them
_NOT_COUNTED = {"constraint_violated", "duplicate", *names.INFRA_REASONS}


@dataclass(frozen=True)
class BudgetPlan:
    """How a run spends ``total`` launches. ``search`` includes the baseline when it has not
    run yet (``done == 0``); ``confirm`` is the confirmation's most (``rounds`` x (baseline +
    ``top_k``)): its race may stop earlier and leave launches unspent."""

    total: int
    done: int
    search: int
    top_k: int
    rounds: int
    #: why there is no confirmation, when there is none, and what would make one fit
    no_confirm: str | None = None
    hint: str | None = None

    @property
    def confirm(self) -> int:
        return self.rounds * (self.top_k + 1)

    @property
    def confirms(self) -> bool:
        return self.rounds > 0

    def describe(self) -> str:
        """One line for the progress output, before the first launch."""
        parts = []
        if self.done:
            parts.append(f"{self.done} already made")
        search = self.search
        if self.done == 0 and search:
            parts.append("1 baseline")
            search -= 1
        parts.append(f"{search} search")
        if self.confirms:
            parts.append(f"{self.rounds} rounds x (baseline + {self.top_k}) confirmation at most")
        line = f"budget: {self.total} launches = " + " + ".join(parts)
        if not self.confirms:
            line += f"; {self.no_confirm}" + (f" ({self.hint})" if self.hint else "")
        return line


def plan_budget(
    trials: int, done_launches: int = 0, confirm_top: int = 2, confirm_repeats: int | None = None
) -> BudgetPlan:
    """Split ``trials`` launches (the study's in all, ``done_launches`` of them already made)
    between the search and the confirmation. Raises SpecError (``--confirm-repeats``) when
    explicit rounds do not fit."""
    left = max(0, trials - done_launches)
    # a confirmation needs a baseline and one candidate measured first
    before = 2 if done_launches == 0 else 0
    if confirm_top <= 0:
        return BudgetPlan(trials, done_launches, left, 0, 0, "no confirmation (--confirm-top 0)")
    if confirm_repeats is not None:
        need = confirm_repeats * (confirm_top + 1)
        if need + before > left:
            have = f"--trials {trials}" + (
                f" with {done_launches} launches already made" if done_launches else ""
            )
            raise SpecError(
                f"{confirm_repeats} rounds x (baseline + {confirm_top}) = {need} confirmation "
                f"launches{' plus a baseline and a search trial' if before else ''} do not fit "
                f"in {have}; raise --trials to at least {done_launches + need + before} or "
                "lower --confirm-repeats (or --confirm-top)",
                key="--confirm-repeats",
            )
        return BudgetPlan(trials, done_launches, left - need, confirm_top, confirm_repeats)
    share = min(trials // CONFIRM_SHARE, left - before)
    # a candidate more than the share holds can never get its rounds: start at what could fit,
    # not at --confirm-top (a 20-digit --confirm-top counted down one by one for ever)
    for top in range(min(confirm_top, share), 0, -1):
        rounds = min(PLAN_MAX_ROUNDS, share // (top + 1))
        if top > 1 and rounds < ROUNDS_PER_CANDIDATE:
            continue  # rounds before candidates
        if rounds >= MIN_ROUNDS:
            return BudgetPlan(trials, done_launches, left - rounds * (top + 1), top, rounds)
    where = f"{trials} launches"
    if done_launches:
        where = f"the {left} launches left of {trials}"
    return BudgetPlan(
        trials,
        done_launches,
        left,
        0,
        0,
        f"no confirmation fits in {where}",
        f"it needs {MIN_ROUNDS} rounds x (baseline + 1) = {MIN_ROUNDS * 2} launches and gets "
        f"at most a fifth: from --trials {MIN_ROUNDS * 2 * CONFIRM_SHARE}, or ask with "
        "--confirm-repeats",
    )


def launches_made(trials: Iterable[FrozenTrial]) -> int:
    """Servers ``autotune run`` already started in a study: its finished baseline, search,
    retry and confirmation trials, less those that never launched (a broken constraint, a
    duplicate of another worker's trial) and the infrastructure faults the loop retries
    without counting them."""
    return sum(
        1
        for t in trials
        if t.state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
        and t.user_attrs.get(names.ROLE, names.SEARCH) in RUN_ROLES
        and t.user_attrs.get(names.FAIL_REASON) not in _NOT_COUNTED
    )
