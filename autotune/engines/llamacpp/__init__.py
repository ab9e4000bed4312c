"""The llama.cpp engine (``engine.kind: llamacpp``): everything autotune knows about
llama.cpp's ``llama-server`` lives in this package.

``engine.py`` (launch, defaults, export), ``binary.py`` (which binary runs, its version),
``help.py`` (its ``--help``, parsed), ``validate.py`` (a space against that help), ``logs.py``
(failure reasons and root causes from its log), ``metrics.py`` (its Prometheus names) and
``dialect.py`` (what it does with autotune's requests).
"""
