"""The search benchmark's SIMULATED landscapes (cost models, not measurements).

Each module is a landscape for ``python -m benchmarks.search --landscape FILE.py:landscape``
(the protocol: ``benchmarks/search/landscape.py``), beside its space in ``search_spaces/``:

* ``glm5.py`` -- the GLM-5 8-GPU simulation (``autotune.testing.glm5_sim``),
  ``search_spaces/glm5-8gpu.yaml``;
* ``interactions.py`` -- interactions, numeric dims that matter, an OOM cliff,
  ``search_spaces/interactions-sim.yaml``;
* ``unseen.py`` -- written after the default strategy was chosen (an overfitting check),
  ``search_spaces/unseen-sim.yaml``;
* ``numeric.py`` -- two numeric values with a smooth interior peak,
  ``search_spaces/numeric-sim.yaml``.
"""
