"""The study: the trial loop (loop.py), one trial top to bottom (trial.py), what is recorded
(record.py), which trial is best (results.py) and export.
"""
