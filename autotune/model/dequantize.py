"""A GGUF model dequantized to a bf16 Hugging Face folder, for engines that cannot load GGUF.

Why: vLLM 0.32 has no GGUF loader of its own, and the out-of-tree ``vllm-gguf-plugin``
dequantizes with Triton kernels that need CUDA, so on a CPU machine vLLM can only serve a GGUF
model as a dequantized copy (measured with vLLM 0.32). transformers keeps GGUF weights
packed and refuses to save them, but its GGUF reader returns Hugging Face-named, dequantized
tensors; this loads them into the architecture's model class built from the GGUF's own config
and saves that, with the GGUF's tokenizer, as safetensors::

    python -m autotune.model.dequantize models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \\
        models/smollm2/bf16

The copy holds the same numbers as the GGUF's dequantized weights, rounded to bf16 (the file's
4-bit blocks carry fp16 scales, so bf16 loses a little of each scale's precision). It is a
different model file from the GGUF, not the same deployment: a study of the copy tunes the
copy. The output folder is written whole or not at all (``OUTDIR.tmp`` renamed at the end).
Needs ``torch``, ``transformers`` and ``gguf`` (installed with vLLM); about a minute and
twice the output's size in memory for a 135M model.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from autotune.model.facts import InspectError
from autotune.model.gguf_reader import has_gguf_magic

__all__ = ["DequantizedModel", "dequantize_gguf", "main"]

#: tensors a model may hold that are not weights in the file: the output projection when the
#: embedding is tied to it, rotary tables computed at load
_DERIVED_TENSORS = ("lm_head.weight", "rotary_emb.inv_freq")


@dataclass(frozen=True)
class DequantizedModel:
    """What :func:`dequantize_gguf` wrote: the folder, the model class named in its
    ``config.json``, how many weight tensors it holds and their bytes on disk."""

    out_dir: Path
    architecture: str
    tensors: int
    weight_bytes: int


def check_arguments(gguf_path: Path, out_dir: Path) -> None:
    """Refuse, before anything is loaded, a GGUF path that is not a GGUF file and an output
    folder that already holds something (a previous copy is never overwritten in place)."""
    if not gguf_path.is_file():
        raise InspectError("no such GGUF file", file=str(gguf_path))
    if not has_gguf_magic(gguf_path):
        raise InspectError(
            "not a GGUF file (it does not start with the GGUF magic)", file=str(gguf_path)
        )
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise InspectError(
            "output exists and is not an empty folder; remove it or name another", file=str(out_dir)
        )


def dequantize_gguf(gguf_path: Path, out_dir: Path) -> DequantizedModel:
    """Write ``out_dir``: ``config.json`` (with ``architectures`` set: transformers leaves it
    None for a GGUF config, and vLLM picks its model class from it), bf16 safetensors and the
    tokenizer. Raises :class:`InspectError` for bad arguments and for a GGUF whose tensors do
    not fill the model its config describes."""
    check_arguments(gguf_path, out_dir)
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one line says what was written; no bars in make's log
    folder, name = str(gguf_path.parent), gguf_path.name
    config = AutoConfig.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_config(config)
    # the reader maps GGUF names to the names of the model it is given
    tensors = load_gguf_checkpoint(str(gguf_path), return_tensors=True, model_to_load=model)[
        "tensors"
    ]
    result = model.load_state_dict(tensors, strict=False)
    missing = [k for k in result.missing_keys if not k.endswith(_DERIVED_TENSORS)]
    if missing or result.unexpected_keys:
        raise InspectError(
            f"the GGUF's tensors do not fit {type(model).__name__}: "
            f"missing {missing[:5]}, unexpected {list(result.unexpected_keys)[:5]}",
            file=str(gguf_path),
        )
    if "lm_head.weight" in result.missing_keys:
        model.tie_weights()
    model = model.to(torch.bfloat16)
    model.config.architectures = [type(model).__name__]
    model.config.dtype = torch.bfloat16
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)

    staging = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    if out_dir.exists():
        out_dir.rmdir()  # empty: check_arguments said so
    staging.rename(out_dir)
    weights = sorted(out_dir.glob("*.safetensors"))
    return DequantizedModel(
        out_dir=out_dir,
        architecture=type(model).__name__,
        tensors=len(tensors),
        weight_bytes=sum(p.stat().st_size for p in weights),
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autotune.model.dequantize",
        description="Dequantize a GGUF model into a bf16 Hugging Face folder (safetensors, "
        "config.json, tokenizer) that vLLM on a CPU can serve.",
    )
    p.add_argument("gguf", type=Path, help="the GGUF file (one file; split models are not read)")
    p.add_argument("out_dir", type=Path, metavar="OUTDIR", help="a new or empty folder")
    return p


def main(argv: list[str] | None = None) -> int:
    """Exit 0 with one line saying what was written; 2 with one line naming the bad argument."""
    args = _parser().parse_args(argv)
    try:
        done = dequantize_gguf(args.gguf, args.out_dir)
    except InspectError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        f"wrote {done.out_dir}: {done.architecture}, {done.tensors} tensors from "
        f"{args.gguf.name}, {done.weight_bytes / 1e6:,.1f} MB of bf16 safetensors"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
