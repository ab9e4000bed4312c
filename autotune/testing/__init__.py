"""Test doubles and simulations. Nothing here is used by ``autotune run`` by default.

* :mod:`autotune.testing.toy_model` -- a deterministic word-level "model" (tokenizer, greedy
  continuation, fixed logprobs) so a correctness gate has something exact to compare.
* :mod:`autotune.testing.fake_server` -- a small OpenAI-compatible completion server speaking the
  subset of vLLM's API that autotune uses, with a batching speed model and fault injection
  (``python -m autotune.testing.fake_server --help``).
* :mod:`autotune.testing.glm5_sim` -- a **simulation** (a cost model, not a measurement) of the
  motivating GLM-5 744B deployment on 8 PCIe GPUs, for the search-efficiency benchmark and tests.
* :mod:`autotune.testing.make_gguf` -- small GGUF files written from numpy, for the model-inspection
  tests.
* :mod:`autotune.testing.demo_model` -- trains and writes the embedded demo model (``models/demo``;
  needs torch and transformers).

Their third-party dependencies are declared as extras, not as autotune's own: ``pip install
'autotune[testing]'`` for the doubles (starlette, uvicorn, numpy), ``autotune[demo-model]`` for the
demo model's builder. No module outside this package imports it (tests/test_packaging.py checks).

They exist so that server lifecycle, correctness gate, benchmark client and the study loop can be
tested on a laptop in seconds, including every failure mode a real engine shows (crash, hang, OOM,
rejected flags, healthy-but-broken, fast-but-wrong).
"""
