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
  ``search_spaces/numeric-sim.yaml``;
* ``capture.py`` -- CUDA-graph capture sizes that pay off only when they cover the served
  batch, startup growing with them, ``search_spaces/capture-sim.yaml``;
* ``nccl.py`` -- NCCL protocol / algorithm / P2P level and a custom all-reduce on eight PCIe
  GPUs, a wrong combination of two settings, ``search_spaces/nccl-sim.yaml``;
* ``offload.py`` -- flat with an OOM cliff: memory fraction, CPU offload, KV dtype,
  ``search_spaces/offload-sim.yaml``.

The last three are built from published measurements (their docstrings cite them) and define
``startup_s(params)``: a launch costs what its config costs. All seven run in one command:
``python -m benchmarks.search.suite``.
"""
