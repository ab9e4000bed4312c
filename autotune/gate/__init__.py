"""The correctness gate: a config's output is compared with the pinned reference before any speed
is measured.
"""
