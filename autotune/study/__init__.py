"""The study: the trial loop and everything a study stores.

* :mod:`~autotune.study.loop` -- :func:`run_study`, the loop over trials, and the study's
  creation, preflight and resume;
* :mod:`~autotune.study.trial` -- one trial top to bottom: launch, gate, measure, verdict;
* :mod:`~autotune.study.record` -- what a trial stores, and its objective values;
* :mod:`~autotune.study.results` -- which trials count, and which is best;
* :mod:`~autotune.study.export` -- the best config in the engine's own terms;
* :mod:`~autotune.study.cleanup`, :mod:`~autotune.study.parallel`,
  :mod:`~autotune.study.warm_start`, :mod:`~autotune.study.termination`.
"""

from __future__ import annotations

from autotune.study.loop import RunOptions, open_study, run_study
from autotune.study.results import best_trials

__all__ = ["RunOptions", "best_trials", "open_study", "run_study"]
