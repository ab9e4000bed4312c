"""The spec's fixed ``engine.args`` as keys of a config file for ``vllm serve --config``.

vLLM's loader (``FlexibleArgumentParser.load_config_file``) turns each key back into
``--key str(value)`` (a mapping into JSON, ``true`` into the bare flag): so a key must be a long
flag name and a value the text the command line had, or the exported config launches another
server than the one the trials measured.
"""

from __future__ import annotations

import json
import re
from typing import Any

from autotune.errors import SpecError

#: vLLM's short flags and the long ones they stand for (vLLM 0.32's ``make_arg_parser``): a
#: config file for ``vllm serve --config`` holds long names only
SHORT_FLAGS = {
    "-n": "--nnodes",
    "-r": "--node-rank",
    "-tp": "--tensor-parallel-size",
    "-dcp": "--decode-context-parallel-size",
    "-pcp": "--prefill-context-parallel-size",
    "-dp": "--data-parallel-size",
    "-dpn": "--data-parallel-rank",
    "-dpr": "--data-parallel-start-rank",
    "-dpl": "--data-parallel-size-local",
    "-dpa": "--data-parallel-address",
    "-dpp": "--data-parallel-rpc-port",
    "-dpb": "--data-parallel-backend",
    "-dph": "--data-parallel-hybrid-lb",
    "-dpe": "--data-parallel-external-lb",
    "-dpm": "--data-parallel-multi-port-external-lb",
    "-ep": "--enable-expert-parallel",
    "-sc": "--speculative-config",
    "-dc": "--diffusion-config",
    "-cc": "--compilation-config",
    "-ac": "--attention-config",
}
#: a word that is a flag, not a value: ``--x``, or a short ``-x`` (``-1`` is a value)
_FLAG_WORD = re.compile(r"--?[A-Za-z]")


def args_to_config(args: list[str]) -> dict[str, Any]:
    """Turn ``["--max-model-len", "512", "--enforce-eager", "-tp", "2"]`` into config-file keys,
    as the trial's command line read them: a short flag under its long name, every value the
    text it was (vLLM's loader passes ``str(value)`` back: a revision ``0123`` written as a YAML
    number came back as ``123``, ``4e35`` as ``4e+35``), a JSON object as a mapping. A short
    spelling vLLM has no long name for here (``-O3``) cannot go in the file: refused."""
    config: dict[str, Any] = {}
    index = 0
    while index < len(args):
        word = args[index]
        if not _FLAG_WORD.match(word):
            index += 1  # a value whose flag came before (or a positional word)
            continue
        flag, eq, attached = word.partition("=")
        if not flag.startswith("--"):
            if flag not in SHORT_FLAGS:
                raise SpecError(
                    f"{word!r} has no long name autotune knows, and a config file for `vllm "
                    "serve --config` holds long names only: write its long form",
                    key=f"engine.args[{index}]",
                )
            flag = SHORT_FLAGS[flag]
        key = flag[2:]
        if eq:
            config[key] = _value(attached)
            index += 1
        elif index + 1 < len(args) and not _FLAG_WORD.match(args[index + 1]):
            config[key] = _value(args[index + 1])
            index += 2
        else:
            config[key] = True
            index += 1
    return config


def _value(text: str) -> Any:
    """A flag's value as the config file must hold it: the text, or a JSON object's mapping
    (the loader writes a mapping back as JSON)."""
    if text.startswith("{"):
        try:
            found = json.loads(text)
        except json.JSONDecodeError:
            return text
        return found if isinstance(found, dict) else text
    return text
