"""`autotune compare A B`: two studies, or two exported configs, side by side.

Two studies (each a spec file or ``NAME@URL``): the best config of each (``report.best_trials``),
the parameters in which they differ, every metric with a 95% interval where the config was
measured more than once (search, confirmation and ablation rounds of the same values), and the
trials of each by verdict.

Two exported configs (``autotune export`` files): each is turned back into values of the spec's
search space (and refused, naming the file and key, when it cannot be: compare launches through
the same gate as a study, so a config must be one the study could have run), then both are
measured through the gate in interleaved rounds (A, B, A, B, ...; ``remeasure.measure_variants``,
as the confirmation does) in a study of their own, ``<spec study>-compare``, whose baseline
records the reference. The answer is B's gain over A with the confirmation's 95% Welch t
interval on the log ratio: real when the interval excludes zero.
"""

from __future__ import annotations

import contextlib
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autotune import names
from autotune._files import MAX_YAML_BYTES, read_bounded
from autotune._stats import positive_interval
from autotune.analysis.confirm import gain_with_ci
from autotune.analysis.remeasure import Variant, measure_variants
from autotune.engines import build_engine
from autotune.engines.export_files import ExportFormatError, env_path_for
from autotune.errors import AutotuneError, SpecError
from autotune.spec.load import load_spec
from autotune.spec.model import StudySpec
from autotune.storage import check_study_name, load_study, resolve_url, safe_url, sqlite_file
from autotune.study.export import render_files
from autotune.study.loop import RunOptions, open_study, run_study, storage_url_for
from autotune.study.results import (
    ReportSource,
    best_trials,
    is_verified_feasible,
    objective_names,
    report_of,
    snapshot,
)


@dataclass(frozen=True)
class StudyRef:
    label: str  # as the user gave it
    url: str
    name: str


@dataclass(frozen=True)
class MetricStat:
    samples: tuple[float, ...]
    median: float
    ci: tuple[float, float] | None  # 95% t interval of the mean, None for one sample


@dataclass(frozen=True)
class StudySide:
    ref: StudyRef
    best: int | None
    params: dict[str, Any]
    metrics: dict[str, MetricStat]
    verdicts: dict[str, int]
    objective: tuple[str, ...]
    directions: tuple[str, ...]
    #: the engine and its version the study ran (two engines compare on one model too)
    engine: str | None = None
    #: the study's pinned workload (``names.WORKLOAD``: its hash and source), if recorded
    workload: dict[str, Any] | None = None


@dataclass(frozen=True)
class StudyComparison:
    a: StudySide
    b: StudySide
    changed: tuple[str, ...]
    #: B's gain over A on the shared objective, with its 95% interval (None when unknown)
    metric: str | None
    gain: float | None
    gain_ci: tuple[float, float] | None
    #: what the reader must know before reading a gain (e.g. two different workloads)
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ConfigResult:
    label: str
    path: Path
    values: dict[str, Any]
    samples: tuple[float, ...]
    failures: tuple[str, ...]


@dataclass(frozen=True)
class ConfigComparison:
    metric: str
    direction: str
    a: ConfigResult
    b: ConfigResult
    gain: float | None  # B over A, > 0 when B is better
    gain_ci: tuple[float, float] | None
    study: str
    storage_url: str
    notes: list[str] = field(default_factory=list)

    @property
    def real(self) -> bool:
        return self.gain_ci is not None and (self.gain_ci[0] > 0 or self.gain_ci[1] < 0)


# --- what the arguments are -----------------------------------------------------------------


def kind_of(arg: str) -> str:
    """``study`` (a spec file or NAME@URL) or ``config`` (an exported config); SpecError else."""
    name, sep, url = arg.partition("@")
    if sep and "://" in url and not Path(arg).exists():
        return "study"
    path = Path(arg)
    if not path.is_file():
        raise SpecError("not a file, nor NAME@URL (a study name and its storage URL)", key=arg)
    # a regular file under the bound, as every input: never a device, a FIFO or 50 MB of YAML
    raw = read_bounded(path, what="compare argument", limit=MAX_YAML_BYTES, key=arg)
    text = raw.decode("utf-8", errors="replace")
    if text.startswith("# autotune export"):
        return "config"
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"not YAML: {exc}".splitlines()[0], file=arg) from None
    if isinstance(data, dict) and "engine" in data and "search_space" in data:
        return "study"
    raise SpecError(
        "neither a study spec (engine, search_space) nor a config written by `autotune export`",
        file=arg,
    )


def study_ref(arg: str) -> StudyRef:
    name, sep, url = arg.partition("@")
    if sep and "://" in url and not Path(arg).exists():
        # named in errors and in the comparison with its password hidden, never as typed
        shown = f"{name}@{safe_url(url)}"
        check_study_name(name, key=shown)
        resolve_url(url, key=shown)
        database = sqlite_file(url)
        if database is not None and not database.is_file():
            raise SpecError(f"no study storage at {database}", key=shown)
        return StudyRef(shown, url, name)

    spec = load_spec(Path(arg))
    url = storage_url_for(spec, None)
    database = sqlite_file(url)
    if database is not None and not database.is_file():
        raise SpecError(f"no study storage at {database} (run `autotune run` first)", file=arg)
    return StudyRef(arg, url, spec.name)


# --- two studies ----------------------------------------------------------------------------


def compare_studies(a: str, b: str) -> StudyComparison:
    side_a, side_b = _side(study_ref(a)), _side(study_ref(b))
    param_names = list(dict.fromkeys([*side_a.params, *side_b.params]))
    changed = tuple(n for n in param_names if side_a.params.get(n) != side_b.params.get(n))
    metric = side_a.objective[0] if side_a.objective else None
    gain, ci = None, None
    notes = _workload_notes(side_a, side_b)
    if (
        not notes
        and metric
        and side_b.objective[:1] == (metric,)
        and metric in side_a.metrics
        and metric in side_b.metrics
    ):
        sa, sb = side_a.metrics[metric].samples, side_b.metrics[metric].samples
        sign = names.sign(metric, default="maximize")
        if all(x > 0 for x in (*sa, *sb)):
            if len(sa) >= 2 and len(sb) >= 2:
                gain, ci = gain_with_ci(tuple(sb), tuple(sa), sign)
            else:
                gain = math.expm1(
                    sign * (math.log(statistics.median(sb)) - math.log(statistics.median(sa)))
                )
    return StudyComparison(side_a, side_b, changed, metric, gain, ci, notes)


def _engine_of(study: Any, version: str | None) -> str | None:
    """``kind version`` of the engine a study ran (the kind from its spec, where it loads)."""
    kind = None
    with contextlib.suppress(AutotuneError, OSError, TypeError, KeyError):
        kind = load_spec(Path(study.user_attrs[names.SPEC_PATH])).engine.kind
    return " ".join(p for p in (kind, version) if p) or None


def _workload_notes(a: StudySide, b: StudySide) -> tuple[str, ...]:
    """Why the two sides' figures do not compare: each study pins its workload's hash, and two
    studies measured under different loads say nothing about which config (or engine) is
    faster, however far apart their figures are."""
    hashes = [(side.workload or {}).get("hash") for side in (a, b)]
    if None in hashes:
        return ("a study records no workload: its figures may not compare with the other's",)
    if hashes[0] != hashes[1]:
        return (
            f"the studies measured different workloads ({hashes[0][:12]}: "
            f"{a.workload.get('source')}; {hashes[1][:12]}: {b.workload.get('source')}): "
            "their figures are shown, but no gain is claimed. Give both specs the same workload",
        )
    return ()


def _side(ref: StudyRef) -> StudySide:
    study = load_study(ref.url, ref.name)
    trials = snapshot(study)  # one read: a live study's next trial cannot split the answer
    report = report_of(study, trials=trials)
    objective = tuple(study.metric_names or ())
    if not objective:
        objective = objective_names(study, report, ReportSource(ref.url))
    best = best_trials(study, trials=trials)
    verdicts = dict(
        sorted(
            {
                v: sum(1 for r in report.rows if r.verdict == v)
                for v in {r.verdict for r in report.rows}
            }.items()
        )
    )
    engine = _engine_of(study, report.engine_version)
    workload = study.user_attrs.get(names.WORKLOAD)
    if not best:
        return StudySide(
            ref, None, {}, {}, verdicts, objective, report.directions, engine, workload
        )
    winner = best[0]
    params = dict(winner.user_attrs.get(names.PARAMS_RESOLVED) or winner.params)
    same = [
        t
        for t in trials
        if is_verified_feasible(t)
        and dict(t.user_attrs.get(names.PARAMS_RESOLVED) or t.params) == params
    ]
    metrics: dict[str, list[float]] = {}
    for t in same:
        for name, value in (t.user_attrs.get(names.METRICS) or {}).items():
            metrics.setdefault(name, []).append(float(value))
    return StudySide(
        ref,
        winner.number,
        params,
        {name: _stat(values) for name, values in sorted(metrics.items())},
        verdicts,
        objective,
        report.directions,
        engine,
        workload,
    )


def _stat(values: list[float]) -> MetricStat:
    """Median and 95% interval of a metric's samples; every metric is a rate or a latency, so
    the interval is the log-scale one (``_stats.positive_interval``): never below zero."""
    ci = None
    if len(values) >= 2:
        interval = positive_interval(values)
        ci = (interval.low, interval.high)
    return MetricStat(tuple(values), statistics.median(values), ci)


# --- two exported configs -------------------------------------------------------------------


def config_values(spec: StudySpec, path: Path) -> dict[str, Any]:
    """The search-space values whose export is exactly the config in ``path`` (its main file
    and the ``.env`` beside it, read by the engine that wrote them). SpecError naming the file
    and the key that has no match."""

    engine = build_engine(spec)
    target = _read_export(engine, path)
    config, env = target
    values: dict[str, Any] = {}
    for param in spec.space.parameters:
        if not spec.space.is_active(param, values):
            continue
        candidates = list(param.choices) if param.choices else []
        if param.type == "bool":
            candidates = [True, False]
        elif not candidates:
            candidates = _numbers_at(engine, param, config, env)
            outside = [c for c in candidates if not param.contains(c)]
            if outside:
                # measuring it would compare a config the study could never have proposed,
                # under the spec's name; an edited export is not a trial of this space
                raise SpecError(
                    f"{outside[0]!r} is outside the domain of parameter {param.name!r} "
                    f"({_domain(param)}): this config is not one of the spec's search space",
                    file=str(path),
                    key=param.target.describe(),
                )
        chosen = _MISSING
        best_size = -1
        for candidate in candidates:
            footprint = _footprint(spec, engine, {param.name: candidate})
            if _within(footprint, target) and _size(footprint) > best_size:
                chosen, best_size = candidate, _size(footprint)
        if chosen is not _MISSING:
            values[param.name] = chosen
    if _exported(spec, engine, values) != target:
        config_now, env_now = _exported(spec, engine, values)
        key = (
            next((k for k in config if config_now.get(k, _MISSING) != config[k]), None)
            or next((f"env {k}" for k in env if env_now.get(k, _MISSING) != env[k]), None)
            or next((k for k in config_now if k not in config), None)
            or next((f"env {k}" for k in env_now if k not in env), "?")
        )
        raise SpecError(
            "this config is not one of the spec's search space (or was exported for another "
            f"spec): no parameter value gives {key!r} as written",
            file=str(path),
            key=key,
        )
    return values


_MISSING = object()
#: where ``compare`` renders an export it matches against: the name only shapes the text
#: (a script names its .env), which the engine's reading leaves out
_RENDERED = Path("compare.export")


def _read_export(engine: Any, path: Path) -> tuple[dict, dict]:
    """The export at ``path`` and its ``.env`` (none: no variables), as the engine reads it."""
    env_path = env_path_for(path)
    try:
        text = path.read_text(encoding="utf-8")
        env_text = env_path.read_text(encoding="utf-8") if env_path.is_file() else ""
        exported = engine.parse_export(text, env_text)
    except OSError as exc:
        raise SpecError(f"cannot read the config: {exc}".splitlines()[0], file=str(path)) from None
    except ExportFormatError as exc:
        raise SpecError(str(exc), file=str(path)) from None
    return exported.config, exported.env


def _exported(spec: StudySpec, engine: Any, values: dict[str, Any]) -> tuple[dict, dict]:
    """What ``export.export_values`` writes for ``values``, read back as :func:`_read_export`
    reads the files."""
    files = render_files(spec, engine, values, _RENDERED)
    exported = engine.parse_export(files.body, files.env_text)
    return exported.config, exported.env


def _footprint(spec: StudySpec, engine: Any, values: dict[str, Any]) -> tuple[dict, dict]:
    """The entries one parameter's value adds to (or changes in) the exported files."""
    base_config, base_env = _exported(spec, engine, {})
    config, env = _exported(spec, engine, values)
    return (
        {k: v for k, v in config.items() if base_config.get(k, _MISSING) != v},
        {k: v for k, v in env.items() if base_env.get(k, _MISSING) != v},
    )


def _within(footprint: tuple[dict, dict], target: tuple[dict, dict]) -> bool:
    for part, whole in zip(footprint, target, strict=True):
        for key, value in part.items():
            if key not in whole or not _contains(whole[key], value):
                return False
    return True


def _contains(whole: Any, part: Any) -> bool:
    """Equal, or for a JSON-valued flag every key of ``part`` with the same value in ``whole``."""
    if isinstance(whole, dict) and isinstance(part, dict):
        return all(k in whole and _contains(whole[k], v) for k, v in part.items())
    return whole == part


def _size(footprint: tuple[dict, dict]) -> int:
    return sum(len(p) for p in footprint)


def _domain(param: Any) -> str:
    step = f" step {param.step}" if param.step else ""
    return f"{param.low}..{param.high}{step}"


def _numbers_at(engine: Any, param: Any, config: dict, env: dict) -> list[Any]:
    """An int/float/int_list parameter's value as written at its target (a flag where the
    engine's export writes it: a config key, or an environment variable)."""
    target = param.target
    raw: Any = _MISSING
    if target.kind == "flag":
        part, key = engine.exported_at(target.name)
        raw = (config if part == "config" else env).get(key, _MISSING)
    elif target.kind == "env":
        raw = env.get(target.name, _MISSING)
    elif target.kind == "json":
        raw = config.get(target.name.lstrip("-"), _MISSING)
        for part in str(target.key).split("."):
            raw = raw.get(part, _MISSING) if isinstance(raw, dict) else _MISSING
    if raw is _MISSING:
        return []
    try:
        if param.type == "int_list":
            items = raw if isinstance(raw, list) else str(raw).split(",")
            return [[int(v) for v in items]]
        return [int(raw) if param.type == "int" else float(raw)]
    except (TypeError, ValueError):
        return []


def compare_configs(
    spec: StudySpec,
    a: Path,
    b: Path,
    *,
    repeats: int = 2,
    storage: str | None = None,
    on_phase: Any = None,
) -> ConfigComparison:
    """Measure both configs through the gate, interleaved, and say which is faster."""

    values_a, values_b = config_values(spec, a), config_values(spec, b)
    name = f"{spec.name}-compare"
    url = storage_url_for(spec, storage)
    resolve_url(url)
    study, _ = open_study(spec, url, study_name=name)
    notes = []
    if names.REFERENCE not in study.user_attrs:
        notes.append("the baseline ran first to record the reference the gate checks against")
        run_study(spec, RunOptions(trials=1, storage_url=storage, study_name=name))
        study = load_study(url, name, heartbeat=True)
    label_a, label_b = f"A: {a.name}", f"B: {b.name}"
    if label_a == label_b:
        label_a, label_b = f"A: {a}", f"B: {b}"
    measured = measure_variants(
        spec,
        study,
        url,
        [Variant(label_a, values_a), Variant(label_b, values_b)],
        repeats=repeats,
        role=names.COMPARE,
        on_phase=on_phase,
    )
    metric = spec.objective.metrics[0]
    direction = names.direction(metric)
    sign = names.sign(metric)
    results = [
        ConfigResult(
            label, path, values, tuple(measured[label].samples), tuple(measured[label].failures)
        )
        for label, path, values in ((label_a, a, values_a), (label_b, b, values_b))
    ]
    gain, ci = None, None
    ra, rb = results
    if (
        len(ra.samples) >= 2
        and len(rb.samples) >= 2
        and all(x > 0 for x in (*ra.samples, *rb.samples))
    ):
        gain, ci = gain_with_ci(rb.samples, ra.samples, sign)
    return ConfigComparison(metric, direction, ra, rb, gain, ci, name, url, notes)


def verdict_line(comparison: ConfigComparison | StudyComparison) -> str:
    """One sentence: which is faster, by how much, and whether the difference is real."""
    if comparison.gain is None:
        return "no comparison: one side has no measurement of the objective to compare"
    if comparison.gain_ci is None:
        return (
            f"B measured {comparison.gain:+.1%} against A, from single measurements: no "
            "interval, so no claim that the difference is real"
        )
    low, high = comparison.gain_ci
    interval = f"B {comparison.gain:+.1%} against A (95% CI {low:+.1%} .. {high:+.1%})"
    if low > 0 or high < 0:
        faster = "B" if comparison.gain > 0 else "A"
        return f"{faster} is better: {interval}; the difference is real (the interval excludes 0)"
    return (
        f"no real difference: {interval}; the difference is within the noise "
        "(the 95% interval includes zero)"
    )
