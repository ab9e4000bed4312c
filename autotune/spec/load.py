"""Study specs: ``studies/*.yaml`` loaded into frozen dataclasses, validated once.

A spec names the model, the engine, the search space, the correctness prompts, the workload and
the objective. Relative paths are relative to the spec file, so a spec and its space can move
together. Every problem becomes one :class:`~autotune.errors.SpecError` naming file and key.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from autotune._yaml import YamlDoc, check_keys, check_text, count, load_yaml, number, seconds
from autotune.engines.registry import engine_class, engine_names
from autotune.errors import SpecError
from autotune.names import (
    DEFAULT_OBJECTIVE,
    METRIC_DIRECTIONS,
    SINGLE_REQUEST_METRICS,
    split_level,
)
from autotune.space.load import load_space
from autotune.space.model import ENV_NAME, is_one_line
from autotune.spec import workload as sources  # prompts, file or synthetic: see workload.py
from autotune.spec.checks import (
    check_fixed_args,
    check_launch_size,
    launch_word,
    roofline_section,
    unknown_scheme,
)
from autotune.spec.model import (
    CheckSpec,
    EngineSpec,
    KnownAnswer,
    ModelSpec,
    ObjectiveSpec,
    SloSpec,
    StudySpec,
    WorkloadSpec,
)
from autotune.storage import check_url, study_name_problem

_TOP_KEYS = {
    "study",
    "engine",
    "model",
    "search_space",
    "check",
    "workload",
    "objective",
    "timeouts",
    "storage",
    "description",
    "roofline",
}


def _given(raw: dict[str, Any], key: str, default: Any) -> Any:
    """``raw[key]``, or ``default`` when the key is absent or null. A value of the wrong type
    is returned as written, for the caller to refuse: ``raw.get(key) or default`` read
    ``objective: 0``, ``timeouts: []`` or ``check.known_answers: 0`` as the default."""
    value = raw.get(key)
    return default if value is None else value


def load_spec(path: str | Path) -> StudySpec:
    """Read and validate a study spec and the search space it names."""
    doc = load_yaml(path, what="study spec")
    data = check_keys(
        doc,
        doc.data,
        "",
        _TOP_KEYS,
        {"study", "engine", "model", "search_space", "check", "workload"},
    )
    name = data["study"]
    problem = study_name_problem(name)
    if problem is not None:
        raise doc.error("study", problem)
    base = doc.path.parent
    space_rel = data["search_space"]
    if not isinstance(space_rel, str):
        raise doc.error("search_space", "must be a path to a search-space YAML file")
    space_path = base / space_rel
    if not space_path.is_file():
        raise doc.error("search_space", f"file not found: {space_path}")
    engine = _engine(doc, data["engine"], base)
    key_env = engine_class(engine.kind).key_env
    own_flags = engine_class(engine.kind).own_flags
    own_env = engine_class(engine.kind).own_env
    words = [*engine.command, *engine.args]
    space = load_space(
        space_path,
        reserved_env={
            **own_env,
            key_env: "the engine's API key, which autotune sets per trial",
        },
        reserved_flags={  # "--model", "{served_name}": the template sets the flag
            **own_flags,
            **{
                flag: f"the spec's engine command sets it ({flag} {word})"
                for flag, word in zip(words, words[1:], strict=False)
                if flag.startswith("--") and re.search(r"\{[a-z_]+\}", word)
            },
            **{  # one word: "--model={served_name}"
                flag.split("=", 1)[0]: f"the spec's engine command sets it ({flag})"
                for flag in words
                if flag.startswith("--") and re.search(r"=.*\{[a-z_]+\}", flag)
            },
        },
    )
    check_text(doc, "description", data.get("description"))
    timeouts = check_keys(
        doc,
        _given(data, "timeouts", {}),
        "timeouts",
        {"startup_s", "max_consecutive_infra_failures"},
    )
    storage = data.get("storage")
    if storage is not None and not isinstance(storage, str):
        raise doc.error("storage", "must be an SQLAlchemy URL string")
    if storage is not None:
        try:
            check_url(storage)
        except SpecError as exc:
            raise doc.error("storage", exc.message) from None
        problem = unknown_scheme(storage)
        if problem:
            raise doc.error("storage", problem)
    spec = StudySpec(
        path=doc.path,
        name=name,
        engine=engine,
        model=_model(doc, data["model"], base),
        space=space,
        check=_check(doc, data["check"]),
        workload=(
            workload := _workload(doc, data["workload"], base, _model(doc, data["model"], base))
        ),
        objective=_check_objective_levels(
            doc, _objective(doc, _given(data, "objective", {})), workload, data
        ),
        startup_timeout_s=seconds(doc, "timeouts.startup_s", timeouts.get("startup_s", 300)),
        max_consecutive_infra_failures=count(
            doc,
            "timeouts.max_consecutive_infra_failures",
            timeouts.get("max_consecutive_infra_failures", 3),
        ),
        storage=storage,
        roofline=roofline_section(doc, data.get("roofline")),
    )
    check_fixed_args(doc, engine_class(engine.kind), spec.engine, spec.space)
    check_launch_size(doc, spec.space, engine_class(engine.kind)(spec.engine, spec.model))
    return spec


def _engine(doc: YamlDoc, raw: Any, base: Path) -> EngineSpec:
    raw = check_keys(
        doc,
        raw,
        "engine",
        {"kind", "command", "args", "env", "patch_dirs", "health_path", "version_command"},
        {"kind"},
    )
    kind = raw["kind"]
    kinds = engine_names()
    if kind not in kinds:
        raise doc.error("engine.kind", f"unknown engine {kind!r} (one of {kinds})")
    try:
        engine = engine_class(kind)
    except SpecError as exc:
        raise doc.error("engine.kind", exc.message) from None
    command = raw.get("command")
    if command is None:
        if engine.default_command is None:
            raise doc.error("engine.command", f"the {kind} engine needs a command template")
        command = list(engine.default_command)
    if not (isinstance(command, list) and command and all(isinstance(c, str) for c in command)):
        raise doc.error("engine.command", "must be a non-empty list of strings (no shell)")
    if not command[0]:
        raise doc.error("engine.command[0]", "the program to start cannot be empty")
    problem = engine.command_problem(command)
    if problem:
        raise doc.error("engine.command", problem)
    args = _given(raw, "args", [])
    if not isinstance(args, list):
        raise doc.error("engine.args", "must be a list of strings")
    for index, arg in enumerate(args):
        doc.refuse_yaml11_bool(f"engine.args[{index}]", arg)
        launch_word(doc, f"engine.args[{index}]", arg)
    for what, parts in (("command", command), ("args", args)):
        for index, part in enumerate(parts):
            launch_word(doc, f"engine.{what}[{index}]", part)
            if "{api_key}" in str(part):
                raise doc.error(
                    f"engine.{what}[{index}]",
                    "{api_key} on the command line would show the key in `ps`; the server "
                    f"gets it in the {engine.key_env} environment variable, or name your own "
                    'with engine.env: {MY_SERVER_API_KEY: "{api_key}"}',
                )
    env = _given(raw, "env", {})
    if not isinstance(env, dict):
        raise doc.error("engine.env", "must be a mapping of variable -> value")
    for raw_var, value in env.items():
        var = doc.name("engine.env", raw_var, "variable name")
        if not ENV_NAME.fullmatch(var):
            raise doc.error(f"engine.env.{var}", "not a variable name (letters, digits, _)")
        if var == engine.key_env or var.startswith("AUTOTUNE_"):  # replaced at every launch
            raise doc.error(f"engine.env.{var}", "autotune sets this variable itself")
        doc.refuse_yaml11_bool(f"engine.env.{var}", value)
        launch_word(doc, f"engine.env.{var}", value, prefix=f"{var}=")
        if isinstance(value, str) and not is_one_line(value):
            raise doc.error(f"engine.env.{var}", f"must be one line of text, got {value!r}")
    version_command = _given(raw, "version_command", [])
    if not (isinstance(version_command, list) and all(isinstance(c, str) for c in version_command)):
        raise doc.error("engine.version_command", "must be a list of strings (no shell)")
    if version_command and not version_command[0]:
        raise doc.error("engine.version_command[0]", "the program to start cannot be empty")
    if version_command and not engine.takes_version_command:
        raise doc.error("engine.version_command", "only the command engine takes it")
    dirs = _given(raw, "patch_dirs", ["../patches"])  # []: no patch directory
    if not isinstance(dirs, list) or not all(isinstance(d, str) and d for d in dirs):
        raise doc.error("engine.patch_dirs", "must be a list of directories")
    patch_dirs = tuple((base / d).resolve() for d in dirs)
    health = raw.get("health_path", "/health")
    if not (isinstance(health, str) and re.fullmatch(r"/[^\s?#]*", health)):
        # appended to the server's address: "health" made http://127.0.0.1:8000health
        raise doc.error("engine.health_path", f"must be a path such as /health, got {health!r}")
    return EngineSpec(
        kind=kind,
        command=tuple(command),
        args=tuple(str(a) for a in args),
        env={str(k): str(v) for k, v in env.items()},
        patch_dirs=patch_dirs,
        health_path=str(health),
        version_command=tuple(version_command),
    )


def _model(doc: YamlDoc, raw: Any, base: Path) -> ModelSpec:
    raw = check_keys(doc, raw, "model", {"path", "served_name", "tokenizer"}, {"path"})
    path = raw["path"]
    if not isinstance(path, str) or not path:
        raise doc.error("model.path", "must be a path (or an engine model id)")
    tokenizer = raw.get("tokenizer")
    for field_name, kinds in (("served_name", str | int), ("tokenizer", str)):
        value = raw.get(field_name)  # a list became the name "['x']"
        if value is not None and (isinstance(value, bool) or not isinstance(value, kinds)):
            raise doc.error(f"model.{field_name}", f"must be a string, got {value!r}")
        if value == "":  # "" became the model's folder name, or the spec's own folder
            raise doc.error(f"model.{field_name}", "must be a non-empty string")
    # Each is one launch word (vLLM's --served-model-name, llama.cpp's --alias, a template's
    # {served_name}): one over Linux's limit failed the first launch with "Argument list too
    # long", after the study was created. Checked as written, then as resolved.
    for key in ("path", "served_name", "tokenizer"):
        if raw.get(key) is not None:
            launch_word(doc, f"model.{key}", raw[key])
    local = base / path
    # A relative path that exists next to the spec is a local folder; otherwise keep it as an
    # engine model id / absolute path and let preflight decide whether it exists.
    resolved = str(local.resolve()) if (path.startswith(".") or _exists(local)) else path
    if tokenizer is not None:
        tok_local = base / str(tokenizer)
        tokenizer = str(tok_local.resolve()) if _exists(tok_local) else str(tokenizer)
    for key, value in (("path", resolved), ("tokenizer", tokenizer)):
        if value is not None:
            launch_word(doc, f"model.{key}", value)
    served = _given(raw, "served_name", Path(path).name or "model")
    return ModelSpec(path=resolved, served_name=str(served), tokenizer=tokenizer)


def _exists(path: Path) -> bool:
    """Whether ``path`` exists; False where the system cannot say (a name over 255 bytes)."""
    try:
        return path.exists()
    except OSError:
        return False


def _check(doc: YamlDoc, raw: Any) -> CheckSpec:
    raw = check_keys(
        doc,
        raw,
        "check",
        {
            "prompts",
            "max_tokens",
            "known_answers",
            "logprob_tolerance",
            "tolerance_floor",
            "under_load_sample",
        },
        {"prompts"},
    )
    prompts = _strings(doc, "check.prompts", raw["prompts"])
    answers = []
    known = _given(raw, "known_answers", [])
    if not isinstance(known, list):  # 0 turned the known-answer checks off
        raise doc.error("check.known_answers", "must be a list of {prompt, expect}")
    for index, item in enumerate(known):
        key = f"check.known_answers[{index}]"
        item = check_keys(doc, item, key, {"prompt", "expect"}, {"prompt", "expect"})
        for part in ("prompt", "expect"):  # a list was sent as the text "['...']"
            value = item[part]
            if isinstance(value, bool) or not isinstance(value, str | int | float) or value == "":
                raise doc.error(f"{key}.{part}", f"must be a non-empty string, got {value!r}")
        try:
            re.compile(str(item["expect"]))
        except re.error as exc:
            raise doc.error(f"{key}.expect", f"invalid regular expression: {exc}") from None
        answers.append(KnownAnswer(prompt=str(item["prompt"]), expect=str(item["expect"])))
    tol = raw.get("logprob_tolerance", "auto")
    tol = None if tol == "auto" else number(doc, "check.logprob_tolerance", tol, positive=True)
    return CheckSpec(
        prompts=prompts,
        max_tokens=count(doc, "check.max_tokens", raw.get("max_tokens", CheckSpec.max_tokens)),
        known_answers=tuple(answers),
        logprob_tolerance=tol,
        tolerance_floor=number(
            doc,
            "check.tolerance_floor",
            raw.get("tolerance_floor", CheckSpec.tolerance_floor),
            positive=True,
        ),
        under_load_sample=count(
            doc,
            "check.under_load_sample",
            raw.get("under_load_sample", CheckSpec.under_load_sample),
            positive=False,
        ),
    )


def _workload(doc: YamlDoc, raw: Any, base: Path, model: ModelSpec) -> WorkloadSpec:

    keys = {
        "prompts",
        "file",
        "limit",
        "synthetic",
        "max_tokens",
        "concurrency",
        "num_requests",
        "single_requests",
        "warmup_requests",
        "repeats",
        "request_timeout_s",
        *_CURVE_KEYS,
    }
    raw = check_keys(doc, raw, "workload", keys, set())
    curve = _curve(doc, raw)
    raw = {
        k: v
        for k, v in raw.items()
        if k not in _CURVE_KEYS and not (k == "concurrency" and "levels" in curve)
    }
    ints = {
        k: count(doc, f"workload.{k}", raw[k], positive=k != "warmup_requests")
        for k in (
            "max_tokens",
            "concurrency",
            "num_requests",
            "single_requests",
            "warmup_requests",
            "repeats",
        )
        if k in raw
    }
    extra = {}
    if "request_timeout_s" in raw:
        extra["request_timeout_s"] = seconds(
            doc, "workload.request_timeout_s", raw["request_timeout_s"]
        )
    built = sources.build(doc, raw, base, model)
    # a file line without max_tokens is answered with workload.max_tokens
    max_tokens = ints.get("max_tokens", WorkloadSpec.max_tokens)
    lengths = tuple(max_tokens if n is None else n for n in built.output_tokens)
    return WorkloadSpec(
        prompts=built.prompts,
        output_tokens=tuple(lengths),
        source=built.source,
        length_unit=built.length_unit,
        chat_format=built.chat_format,
        **ints,
        **extra,
        **curve,
    )


_SLO_RE = re.compile(r"^\s*([a-z0-9_]+(?:@[0-9]+)?)\s*(<=|>=)\s*([0-9.eE+-]+)\s*$")
#: workload keys of the load curve, precision stopping and goodput (see loadcurve.py)
_CURVE_KEYS = ("target_precision", "max_measure_s", "max_repeats", "slo", "goodput_max_concurrency")


def _curve(doc: YamlDoc, raw: dict[str, Any]) -> dict[str, Any]:
    """The load-curve fields of ``workload``; ``concurrency`` may be a list of levels."""
    out: dict[str, Any] = {}
    levels = raw.get("concurrency")
    if isinstance(levels, list):
        if not levels:
            raise doc.error("workload.concurrency", "must be a number or a non-empty list")
        for index, level in enumerate(levels):
            count(doc, f"workload.concurrency[{index}]", level)
        if len(set(levels)) != len(levels):
            raise doc.error("workload.concurrency", f"levels repeat: {levels}")
        out["levels"] = tuple(int(v) for v in levels)
        out["concurrency"] = max(out["levels"])
    if "target_precision" in raw:
        value = number(doc, "workload.target_precision", raw["target_precision"])
        if value >= 1:
            raise doc.error("workload.target_precision", f"a fraction below 1, got {value!r}")
        out["target_precision"] = float(value)
    if "max_measure_s" in raw:
        out["max_measure_s"] = float(seconds(doc, "workload.max_measure_s", raw["max_measure_s"]))
    for key in ("max_repeats", "goodput_max_concurrency"):
        if key in raw:
            out[key] = count(doc, f"workload.{key}", raw[key])
    slos = _given(raw, "slo", [])
    if not isinstance(slos, list):
        raise doc.error("workload.slo", "must be a list like ['ttft_p95_ms <= 500']")
    parsed = [_slo(doc, f"workload.slo[{i}]", text) for i, text in enumerate(slos)]
    for index, slo in enumerate(parsed):
        if split_level(slo.metric)[1] is not None or slo.metric in (
            "goodput",
            *SINGLE_REQUEST_METRICS,
        ):
            raise doc.error(
                f"workload.slo[{index}]", f"{slo.metric} is not a load metric of one level"
            )
    if parsed:
        out["slos"] = tuple(parsed)
    return out


def _slo(doc: YamlDoc, key: str, text: Any) -> SloSpec:
    match = _SLO_RE.match(str(text))
    if not match or split_level(match.group(1))[0] not in METRIC_DIRECTIONS:
        raise doc.error(key, f"expected '<metric> <= <number>' with a known metric, got {text!r}")
    try:
        bound = float(match.group(3))
    except ValueError:
        raise doc.error(key, f"bad number in {text!r}") from None
    if not math.isfinite(bound):
        raise doc.error(key, f"the bound must be a finite number, got {text!r}")
    if bound < 0:  # no metric is negative: "<= -5" never held, ">= -5" always did
        raise doc.error(key, f"the bound must be >= 0 (metrics are never negative), got {text!r}")
    return SloSpec(metric=match.group(1), op=match.group(2), bound=bound)


def _check_objective_levels(
    doc: YamlDoc, objective: ObjectiveSpec, workload: WorkloadSpec, data: dict[str, Any]
) -> ObjectiveSpec:
    """A metric named at a level (``output_tokens_per_s@16``) must name a measured level, and
    ``goodput`` needs the SLOs it is defined by."""
    raw = _given(data, "objective", {})
    names = [
        ("objective.metrics" if "metrics" in raw else "objective.metric", m)
        for m in objective.metrics
    ]
    names += [("objective.constraints", slo.metric) for slo in objective.slos]
    for key, name in names:
        if name == "goodput" and not workload.slos:
            raise doc.error(key, "goodput needs workload.slo (e.g. ['ttft_p95_ms <= 500'])")
        level = split_level(name)[1]
        if level is None:
            continue
        if int(level) not in workload.concurrency_levels:
            raise doc.error(
                key,
                f"{name}: level {level} is not in workload.concurrency "
                f"{list(workload.concurrency_levels)}",
            )
    return objective


def _objective(doc: YamlDoc, raw: Any) -> ObjectiveSpec:
    raw = check_keys(doc, raw, "objective", {"metric", "metrics", "constraints"})
    if "metric" in raw and "metrics" in raw:
        raise doc.error("objective", "give either metric or metrics, not both")
    metrics = raw["metrics"] if "metrics" in raw else [raw.get("metric", DEFAULT_OBJECTIVE)]
    if isinstance(metrics, str):
        metrics = [metrics]
    if not isinstance(metrics, list) or not metrics:  # [] silently meant the default metric
        raise doc.error("objective.metrics", "must be a metric or a non-empty list of metrics")
    if len(set(map(str, metrics))) != len(metrics):
        raise doc.error("objective.metrics", f"a metric is named twice: {metrics}")
    for index, metric in enumerate(metrics):
        if (
            not isinstance(metric, str)
            or not re.fullmatch(r"[a-z0-9_]+(@[0-9]+)?", metric)
            or (split_level(metric)[0] not in METRIC_DIRECTIONS)
        ):
            raise doc.error(
                f"objective.metrics[{index}]" if "metrics" in raw else "objective.metric",
                f"unknown metric {metric!r} (one of {', '.join(METRIC_DIRECTIONS)})",
            )
    constraints = _given(raw, "constraints", [])
    if not isinstance(constraints, list):  # a string was read letter by letter
        raise doc.error("objective.constraints", "must be a list like ['ttft_p95_ms <= 500']")
    slos = [
        _slo(doc, f"objective.constraints[{index}]", text) for index, text in enumerate(constraints)
    ]
    return ObjectiveSpec(metrics=tuple(metrics), slos=tuple(slos))


def _strings(doc: YamlDoc, key: str, raw: Any) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw or not all(isinstance(p, str) and p for p in raw):
        raise doc.error(key, "must be a non-empty list of non-empty strings")
    return tuple(raw)


def spec_error_for_missing_model(spec: StudySpec) -> SpecError | None:
    """A local-looking model path that does not exist is a spec error, caught before trials."""
    path = spec.model.path
    if (path.startswith("/") or path.startswith(".")) and not Path(path).exists():
        return SpecError(f"model not found: {path}", file=str(spec.path), key="model.path")
    return None
