"""The study spec: its frozen dataclasses (model.py), the loader that builds them from YAML
(load.py), the checks at load (checks.py) and the workload's prompts (workload.py).
"""
