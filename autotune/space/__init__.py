"""The search space: its parameters, constraints, the YAML that declares them, and the typed
settings a config turns into.
"""
