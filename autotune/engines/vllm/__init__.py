"""The vLLM engine: everything autotune knows about vLLM lives in this package.

``engine.py`` (launch, export, failure reading, request dialect), ``validate.py`` (a space
against the installed vLLM's own parser), ``machine.py`` (choices this machine cannot run),
``logs.py`` (failure reasons and root causes from vLLM's logs), ``metrics.py`` (its Prometheus
names), ``plugin.py`` (the general plugin that applies patches inside vLLM's processes) and
``version.py`` (the installed version). Kept free of imports, so the plugin stays cheap.
"""
