"""Measurement: autotune's own client measures each verified config.

* :mod:`~autotune.bench.phase` -- one benchmark phase and its figures;
* :mod:`~autotune.bench.loadcurve` -- rounds, precision stopping, load curves, goodput;
* :mod:`~autotune.bench.remote` -- ``autotune bench --url``: a server autotune did not start.
"""

from __future__ import annotations

from autotune.bench.loadcurve import run_benchmark
from autotune.bench.remote import bench_remote

__all__ = ["bench_remote", "run_benchmark"]
