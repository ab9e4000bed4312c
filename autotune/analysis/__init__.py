"""Analyses that launch configs again after the search: confirmation, ablation, recheck,
compare and profile (each through the full gate), and the profiler trace's breakdown.
"""

from __future__ import annotations

from autotune.analysis.ablation import run_ablation
from autotune.analysis.compare import compare_configs, compare_studies
from autotune.analysis.confirm import confirm_study
from autotune.analysis.profile import run_profiles
from autotune.analysis.recheck import run_recheck

__all__ = [
    "compare_configs",
    "compare_studies",
    "confirm_study",
    "run_ablation",
    "run_profiles",
    "run_recheck",
]
