"""The demo model as a GGUF file, for llama.cpp: ``python -m autotune.testing.demo_gguf``.

``make model`` writes ``models/demo/demo-q8_0.gguf`` (about 0.5 MB, git-ignored) from the
committed safetensors, once, so that the embedded demo runs on llama.cpp's ``llama-server`` as
well as on vLLM (``studies/demo-llamacpp.yaml``): a study of llama.cpp's knobs whose server
starts in about a second, where SmolLM2's takes several. Q8_0, the quantization GGUF users
run; its tokenizer splits text as transformers' does (the GPT-2 pre-tokenizer, BOS first),
so the prompts the demo's check judges read the same on both engines.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from autotune.testing.make_gguf import hf_llama_to_gguf

#: where ``make model`` puts it, beside the weights it is converted from
DEMO_GGUF = Path("models/demo/demo-q8_0.gguf")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--src", type=Path, default=Path("models/demo"), help="the HF folder")
    ap.add_argument("--out", type=Path, default=DEMO_GGUF, help="the GGUF file to write")
    args = ap.parse_args(argv)
    tmp = args.out.with_name(args.out.name + ".partial")  # never a half-written model file
    hf_llama_to_gguf(args.src, tmp, qtype="Q8_0")
    tmp.replace(args.out)
    print(f"demo model as GGUF: {args.out} ({args.out.stat().st_size / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
