"""The decode roofline from the command line, with or without a model file.

``autotune inspect MODEL --device D`` covers a model on disk; this also takes bare parameter
counts (``--active-params 40e9 --bits 4.8``), a KV cache size, an efficiency factor and the
device table, which is how ``docs/guide/glm5.md`` works the GLM-5 case before any file exists::

    python -m autotune.model.roofline_cli --active-params 40e9 --bits 4.8 --device h200 --tp 8
    python -m autotune.model.roofline_cli path/to/model.gguf --device h100-sxm --tp 2 --context 4096
"""

from __future__ import annotations

import argparse
import math
import sys

from autotune.model.reader import inspect_model
from autotune.model.roofline import DEVICES, DecodeBytes, decode_roofline, roofline_rows


def _positive(text: str) -> float:
    """A finite number above zero (argparse then exits 2 naming the option): an infinite
    bandwidth divided by zero, a NaN one printed "nan tok/s", a negative rate a traceback."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number above 0, got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autotune.model.roofline_cli",
        description="Upper bound on single-request decode tok/s from memory bandwidth.",
    )
    p.add_argument("model", nargs="?", help="GGUF file or HF folder to inspect for the bytes")
    p.add_argument("--active-params", type=_positive, help="active parameters per token, e.g. 40e9")
    p.add_argument("--bits", type=_positive, help="average stored bits per active weight, e.g. 4.8")
    p.add_argument(
        "--kv-bytes-per-token",
        type=float,
        default=None,
        help="KV cache bytes per context token over all layers (with --active-params)",
    )
    p.add_argument(
        "--kv-split-ways",
        type=int,
        default=1,
        help="KV heads the cache splits into over TP (1 = MLA, replicated)",
    )
    p.add_argument(
        "--kv-dtype-bytes",
        type=int,
        default=None,
        help="override KV cache element size (with MODEL), e.g. 1 for fp8",
    )
    p.add_argument("--device", help=f"one of: {', '.join(DEVICES)}")
    p.add_argument(
        "--bandwidth-gbs", type=_positive, help="per-device bandwidth, overrides --device"
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    p.add_argument("--context", type=int, default=0, help="context tokens already in the cache")
    p.add_argument("--efficiency", type=float, default=1.0, help="fraction of peak bandwidth")
    p.add_argument(
        "--measured",
        type=_positive,
        nargs="*",
        default=[],
        help="measured decode tok/s to express as fractions of the bound",
    )
    p.add_argument("--list-devices", action="store_true", help="print the device table")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    out = sys.stdout
    if args.list_devices:
        for d in DEVICES.values():
            print(f"{d.key:14s} {d.bandwidth_gbs:7,.0f} GB/s  {d.name}  [{d.source}]", file=out)
        return 0
    if args.model:
        db = DecodeBytes.from_facts(inspect_model(args.model), kv_dtype_bytes=args.kv_dtype_bytes)
    elif args.active_params is not None and args.bits is not None:
        db = DecodeBytes.from_params(
            args.active_params,
            args.bits,
            kv_bytes_per_context_token=args.kv_bytes_per_token or 0.0,
            kv_split_ways=args.kv_split_ways,
        )
    else:
        print("give MODEL, or --active-params and --bits", file=sys.stderr)
        return 2
    try:
        r = decode_roofline(
            db,
            device=args.device,
            bandwidth_gbs=args.bandwidth_gbs,
            tp=args.tp,
            context_tokens=args.context,
            efficiency=args.efficiency,
        )
    except (KeyError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    rows = roofline_rows(r, args.measured)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}", file=out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
