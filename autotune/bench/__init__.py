"""Measurement: the benchmark phase of a trial (phase.py), load curves (loadcurve.py) and
benchmarking a running server by URL (remote.py).
"""
