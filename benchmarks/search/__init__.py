"""Benchmark OF THE SEARCH on SIMULATED landscapes (cost models; no server, no GPU).

The question: with a search space and a landscape (a function from a config to its noise-free
outcome), how many LAUNCHES does each strategy need before the config it would report as best
is within 5 % of the best *correct* config's TRUE value, and does it ever report a wrong one?

``python -m benchmarks.search --help`` runs it; one module per job:

* :mod:`benchmarks.search.landscape` -- the landscape: imported as a script would be, its
  protocol checked, the noise and the per-launch cost;
* :mod:`benchmarks.search.truth` -- the true best (the oracle), by enumeration;
* :mod:`benchmarks.search.run` -- the run of one strategy: the trial loop, the simulated
  confirmation, the strategies;
* :mod:`benchmarks.search.stats` -- the figures: medians, IQR, paired tests, censored ratios;
* :mod:`benchmarks.search.cli` -- the command line, the printed tables and the result JSON;
* :mod:`benchmarks.search.suite` -- every landscape of the suite x every strategy, one command
  (``python -m benchmarks.search.suite``), one JSON.
"""

from pathlib import Path

#: the repository's root (relative paths on the command line resolve against it)
ROOT = Path(__file__).resolve().parents[2]
