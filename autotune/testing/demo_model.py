"""Build the embedded demo model (``models/demo/``) that autotune tunes out of the box.

The model is a tiny standard Llama (2 layers, hidden 128, 2 attention heads of head_dim 64,
1 KV head) with a 384-token byte-level BPE tokenizer, trained for a bounded wall time on the CPU on
a synthetic corpus whose continuations are unambiguous: counting in digits ("17 18 19 20"),
spelled-out numbers ("one two three four", wrapping after "twenty"), the alphabet ("a b c d",
wrapping after "z"), colours ("red green blue"), days of the week and months of the year.
Greedy decoding therefore has a known right answer, which makes the model useful for checking
that a server configuration keeps outputs correct, and it is small enough to serve with vLLM on
two CPU cores.

The weights are standard Llama tensors (``q_proj``/``k_proj``/``v_proj`` separate on disk), which
vLLM's ``LlamaForCausalLM`` fuses into ``qkv_proj`` at load time.

Usage::

    python -m autotune.testing.demo_model --out models/demo [--seconds 150] [--seed 0] [--steps N]

With ``--steps`` the run is a fixed number of optimizer steps (reproducible); without it, training
stops after ``--seconds`` of wall time, so the step count depends on the machine.

Needs ``torch``, ``transformers`` and ``tokenizers`` (all installed with vLLM).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VOCAB_SIZE = 384
BOS = "<s>"
EOS = "</s>"
SEQ_LEN = 128  # tokens per training window, BOS included
MAX_NUMBER = 500  # digit counting covers 0 .. MAX_NUMBER - 1


def _words(text: str) -> list[str]:
    return text.split()


NUMBER_WORDS = _words(
    "one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
)
LETTERS = list("abcdefghijklmnopqrstuvwxyz")
COLOURS = ["red", "green", "blue"]
DAYS = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
MONTHS = _words(
    "january february march april may june july august september october november december"
)

# Cyclic word sequences (wrap around at the end) and their sampling weights. Digit counting
# (weight DIGIT_WEIGHT) is the hardest task, so it gets the largest share.
CYCLES: dict[str, list[str]] = {
    "number_words": NUMBER_WORDS,
    "alphabet": LETTERS,
    "colours": COLOURS,
    "days": DAYS,
    "months": MONTHS,
}
CYCLE_WEIGHTS = {
    "number_words": 0.18,
    "alphabet": 0.18,
    "colours": 0.08,
    "days": 0.1,
    "months": 0.1,
}
DIGIT_WEIGHT = 0.36

# Prompts with their expected greedy continuation (checked after training, by the unit test
# tests/test_demo_model.py and recorded in the README).
CHECK_PROMPTS: dict[str, str] = {
    "one two three": " four five six seven eight nine",
    "17 18 19": " 20 21 22 23 24 25",
    "d e f": " g h i j k l",
    "red green blue red": " green blue red green blue red",
    "monday tuesday wednesday": " thursday friday saturday sunday monday tuesday",
    "march april may": " june july august september october november",
    "98 99 100": " 101 102 103 104 105 106",
}


# ---------------------------------------------------------------------------------------------
# corpus


def _window(rng: random.Random, n_words: int) -> list[str]:
    """One training text: ``n_words`` consecutive words from a random task and offset."""
    kinds = ["digits", *CYCLES]
    weights = [DIGIT_WEIGHT, *(CYCLE_WEIGHTS[k] for k in CYCLES)]
    kind = rng.choices(kinds, weights)[0]
    if kind == "digits":
        start = rng.randrange(0, MAX_NUMBER - n_words)
        return [str(i) for i in range(start, start + n_words)]
    cycle = CYCLES[kind]
    start = rng.randrange(len(cycle))
    return [cycle[(start + i) % len(cycle)] for i in range(n_words)]


def corpus_lines(seed: int, n_lines: int = 4000, n_words: int = 24) -> list[str]:
    """The synthetic corpus used to train the tokenizer (fixed seed)."""
    rng = random.Random(seed)
    lines = [" ".join(_window(rng, n_words)) for _ in range(n_lines)]
    # Make sure every word of every task appears, whatever the sampling did.
    lines.append(" ".join(str(i) for i in range(MAX_NUMBER)))
    lines.extend(" ".join(c + c[:3]) for c in CYCLES.values())
    return lines


# ---------------------------------------------------------------------------------------------
# tokenizer


def train_tokenizer(lines: list[str], vocab_size: int = VOCAB_SIZE):
    """Byte-level BPE with ``<s>`` (prepended to every encoding) and ``</s>``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(lines, trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tok


def save_tokenizer(tok, out: Path):
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    hf.save_pretrained(str(out))
    # transformers 5 writes its new class name; the old name loads with transformers 4 and 5 alike.
    cfg_path = out / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    return hf


# ---------------------------------------------------------------------------------------------
# training data


class Batcher:
    """Random fixed-length token windows, composed from per-word token ids (no tokenizer calls).

    The byte-level pre-tokenizer splits text into words that carry their leading space, so a
    window's encoding is BOS + ids(first word) + ids(" " + word) for the rest.
    """

    def __init__(self, tok, seed: int, seq_len: int = SEQ_LEN):
        self.rng = random.Random(seed + 1)
        self.seq_len = seq_len
        self.bos = tok.token_to_id(BOS)
        words = {str(i) for i in range(MAX_NUMBER)}
        for cycle in CYCLES.values():
            words.update(cycle)
        self.first = {w: tok.encode(w, add_special_tokens=False).ids for w in words}
        self.rest = {w: tok.encode(" " + w, add_special_tokens=False).ids for w in words}

    def sample(self) -> list[int]:
        ids = [self.bos]
        # Long enough for seq_len + 1 tokens whatever the task (each word is >= 1 token).
        words = _window(self.rng, self.seq_len)
        ids.extend(self.first[words[0]])
        for w in words[1:]:
            if len(ids) > self.seq_len:
                break
            ids.extend(self.rest[w])
        return ids[: self.seq_len + 1]

    def batch(self, size: int):
        import torch

        data = torch.tensor([self.sample() for _ in range(size)], dtype=torch.long)
        return data[:, :-1], data[:, 1:]


# ---------------------------------------------------------------------------------------------
# model


def make_config(tok):
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=344,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=64,  # vLLM's CPU attention rejects head_dim 16
        max_position_embeddings=512,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        bos_token_id=tok.token_to_id(BOS),
        eos_token_id=tok.token_to_id(EOS),
        pad_token_id=None,
    )


@dataclass
class TrainResult:
    steps: int = 0
    seconds: float = 0.0
    final_loss: float = float("nan")
    losses: list[tuple[int, float]] = field(default_factory=list)


def train(
    model,
    batcher: Batcher,
    *,
    seconds: float,
    steps: int | None,
    batch_size: int,
    lr: float,
    log=print,
) -> TrainResult:
    """AdamW with linear warm-up and cosine decay over the step or wall-time budget."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = 30
    res = TrainResult()
    model.train()
    t0 = time.monotonic()
    ema = None
    step = 0
    while True:
        elapsed = time.monotonic() - t0
        progress = step / steps if steps else elapsed / seconds
        if progress >= 1.0:
            break
        scale = min(1.0, (step + 1) / warmup) * (
            0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress))
        )
        for group in opt.param_groups:
            group["lr"] = lr * scale
        x, y = batcher.batch(batch_size)
        logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
        )
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        value = loss.item()
        ema = value if ema is None else 0.95 * ema + 0.05 * value
        step += 1
        if step % 50 == 0:
            res.losses.append((step, round(ema, 4)))
            log(f"  step {step:5d}  t={elapsed:6.1f}s  loss(ema)={ema:.4f}  lr={lr * scale:.2e}")
    res.steps = step
    res.seconds = time.monotonic() - t0
    res.final_loss = float(ema) if ema is not None else float("nan")
    model.eval()
    return res


def greedy(model, hf_tok, prompt: str, max_new_tokens: int = 24) -> str:
    """Greedy continuation of ``prompt`` (text after the prompt)."""
    import torch

    ids = hf_tok(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(
            ids,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=hf_tok.eos_token_id,
        )
    return hf_tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True)


def check_continuations(model, hf_tok, max_new_tokens: int = 24) -> dict[str, dict[str, Any]]:
    results = {}
    for prompt, expected in CHECK_PROMPTS.items():
        got = greedy(model, hf_tok, prompt, max_new_tokens)
        results[prompt] = {"continuation": got, "ok": got.startswith(expected)}
    return results


# ---------------------------------------------------------------------------------------------
# report


def write_readme(out: Path, info: dict[str, Any]) -> None:
    checks = "\n".join(
        f"| `{p}` | `{r['continuation']}` | {'yes' if r['ok'] else 'NO'} |"
        for p, r in info["checks"].items()
    )
    text = f"""# demo: a tiny Llama for trying autotune out of the box

A 2-layer Llama (hidden 128, 2 attention heads of head_dim 64, 1 KV head, MLP 344, tied
embeddings, max_position_embeddings 512) with a {info["vocab_size"]}-token byte-level BPE
tokenizer, trained from scratch on the CPU on a synthetic corpus whose continuations are
unambiguous:

* counting in digits, 0 to {MAX_NUMBER - 1}: `17 18 19 20 ...`
* spelled-out numbers `one` ... `twenty`, wrapping back to `one`
* the alphabet with spaces `a b c ... z`, wrapping back to `a`
* `red green blue` repeated, the days of the week (`monday` ... `sunday`) and the months
  (`january` ... `december`), wrapping around

Every encoding starts with `<s>` (BOS, id {info["bos_token_id"]}); `</s>` (EOS, id
{info["eos_token_id"]}) exists but was never trained, so the model does not stop by itself.
It knows nothing else: prompts outside these patterns give nonsense.

It exists so that autotune's correctness gate has a real model with a known right answer, and is
small enough for vLLM on two CPU cores (`--dtype bfloat16`, 512-token context). The weights are
standard Llama tensors; vLLM's `LlamaForCausalLM` fuses q/k/v into `qkv_proj` when loading.

## How it was made

```
{info["command"]}
```

* parameters: {info["n_params"]:,} ({info["n_params_bytes"]:,} bytes as bf16 safetensors)
* training: {info["steps"]} AdamW steps (lr {info["lr"]}, batch {info["batch_size"]} x
  {SEQ_LEN} tokens, warm-up then cosine decay) in {info["train_seconds"]:.0f} s on
  {info["threads"]} CPU threads, seed {info["seed"]}; final training loss (EMA)
  {info["final_loss"]:.4f}
* torch {info["torch"]}, transformers {info["transformers"]}, tokenizers {info["tokenizers"]}
* trained in float32, saved as bfloat16 with `save_pretrained`

A time-bounded run (no `--steps`) stops after a wall-time budget, so its step count, and thus the
exact weights, depend on the machine; pass `--steps {info["steps"]}` to repeat this run's length.

## Greedy continuations (transformers, float32 compute, 24 new tokens)

| prompt | continuation | as expected |
|---|---|---|
{checks}

Continuations stop after 24 tokens, which can be inside a word (` seven` of ` seventeen`).
"""
    (out / "README.md").write_text(text)


# ---------------------------------------------------------------------------------------------
# main


def build(
    out: Path,
    *,
    seconds: float = 150.0,
    seed: int = 0,
    steps: int | None = None,
    batch_size: int = 64,
    lr: float = 3e-3,
    threads: int | None = None,
    log=print,
) -> dict[str, Any]:
    import tokenizers
    import torch
    import transformers
    from transformers import GenerationConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    random.seed(seed)
    torch.manual_seed(seed)
    torch.set_num_threads(threads or os.cpu_count() or 1)

    t_start = time.monotonic()
    tok = train_tokenizer(corpus_lines(seed))
    hf_tok = save_tokenizer(tok, out)
    log(f"tokenizer: {tok.get_vocab_size()} tokens -> {out / 'tokenizer.json'}")

    config = make_config(tok)
    model = LlamaForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log(f"model: {n_params:,} parameters; training for {steps or f'{seconds:.0f} s'}")

    batcher = Batcher(tok, seed)
    res = train(model, batcher, seconds=seconds, steps=steps, batch_size=batch_size, lr=lr, log=log)
    log(f"trained {res.steps} steps in {res.seconds:.1f} s, final loss {res.final_loss:.4f}")

    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
    )
    model.save_pretrained(str(out), safe_serialization=True)
    for f in out.iterdir():
        f.chmod(0o644)

    # Check what was saved: reload the bf16 weights, compute in float32.
    reloaded = LlamaForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    checks = check_continuations(reloaded, hf_tok)

    argv = ["python -m autotune.testing.demo_model", "--out", str(out), "--seed", str(seed)]
    argv += ["--steps", str(steps)] if steps else ["--seconds", f"{seconds:g}"]
    info = {
        "command": " ".join(argv),
        "vocab_size": tok.get_vocab_size(),
        "bos_token_id": config.bos_token_id,
        "eos_token_id": config.eos_token_id,
        "n_params": n_params,
        "n_params_bytes": (out / "model.safetensors").stat().st_size,
        "steps": res.steps,
        "train_seconds": res.seconds,
        "total_seconds": time.monotonic() - t_start,
        "final_loss": res.final_loss,
        "losses": res.losses,
        "lr": lr,
        "batch_size": batch_size,
        "threads": torch.get_num_threads(),
        "seed": seed,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "checks": checks,
    }
    write_readme(out, info)
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m autotune.testing.demo_model", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--out", type=Path, default=Path("models/demo"), help="output folder")
    ap.add_argument("--seconds", type=float, default=150.0, help="training wall-time budget")
    ap.add_argument(
        "--steps", type=int, default=None, help="fixed step count (overrides --seconds)"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=None, help="torch threads (default: all cores)")
    ap.add_argument("--json", action="store_true", help="print the report as JSON")
    args = ap.parse_args(argv)

    info = build(
        args.out,
        seconds=args.seconds,
        seed=args.seed,
        steps=args.steps,
        batch_size=args.batch_size,
        lr=args.lr,
        threads=args.threads,
    )
    if args.json:
        print(json.dumps(info, indent=2))
    else:
        print(
            f"\nwrote {args.out}/ ({info['n_params']:,} parameters, {info['steps']} steps, "
            f"{info['train_seconds']:.0f} s training)"
        )
        for prompt, r in info["checks"].items():
            print(f"  {'ok ' if r['ok'] else 'BAD'} {prompt!r} -> {r['continuation']!r}")
    return 0 if all(r["ok"] for r in info["checks"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
