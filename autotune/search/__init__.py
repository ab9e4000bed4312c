"""The search: which config to launch next (strategy.py, model.py, guide.py)."""
