"""The server's lifecycle: start, readiness, teardown that proves no process survives (process.py),
out-of-memory evidence (oom.py) and the engine's /metrics (metrics.py).
"""
