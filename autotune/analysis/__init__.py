"""Analyses of a finished or running study: re-measurement, confirmation, ablation, recheck,
compare, profile and trace breakdown.
"""
