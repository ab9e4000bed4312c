"""What a model is, read from its files' metadata: facts (``autotune inspect``) and the decode
roofline. Nothing here loads weights but :mod:`~autotune.model.dequantize`.

* :mod:`~autotune.model.facts` -- the facts' dataclasses and the counting rules;
* :mod:`~autotune.model.gguf_reader`, :mod:`~autotune.model.hf_reader` -- one reader per format;
* :mod:`~autotune.model.reader` -- :func:`inspect_model` (which reader a path needs) and table rows;
* :mod:`~autotune.model.roofline` -- the memory-bandwidth bound on single-request decode;
* :mod:`~autotune.model.dequantize` -- a GGUF model as a bf16 Hugging Face folder, for an engine
  that cannot load GGUF (vLLM's CPU build).
"""
