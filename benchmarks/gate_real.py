"""The correctness gate on real numerics: a real model, a real engine, configs whose right
verdict is known.

The gate's other evidence is the demo model (trained on counting words) and fault patches; a
real model's output distribution has near-ties everywhere, which is where a gate either rejects
correct configs (batch shapes, compiled kernels that differ by one bf16 step) or accepts wrong
ones (a lossy KV cache whose flips land on near-ties). This benchmark launches the baseline and
each configuration of ``benchmarks/gate_real_configs.yaml`` as ordinary gated trials of a
throw-away study, through the product's one door for pinned configurations
(``autotune.analysis.remeasure.measure_variants``: the trial's whole life, the gate's reference,
its tolerance, the check prompts, the known answers and the under-load sample included), and
counts the gate's false rejects and false accepts.

Full run (vLLM CPU, SmolLM2-135M-Instruct from ``make smollm2``; 30 configs, a server start
each, eager ones about 2-3 minutes a trial here, compiled ones about 4-5; about 1.5-2 hours)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gate_real.py --engine vllm

Smoke (the baseline and two configs)::

    PYTHONPATH=$PWD .venv/bin/python benchmarks/gate_real.py --engine vllm \\
        --only six_at_once,fp8_kv_cache --out /tmp/gate_real_smoke.json

Writes ``benchmarks/results/gate_real_<engine>.json`` (after every config, so a run cut short
keeps what it measured) and prints a table: config, expected, verdict, the product's reason,
the first divergent token. A config that could not run for a reason that is not the config's
(an infrastructure failure) is an error, counted apart from the gate's mistakes. Server logs
stay in the work folder printed at the start.

Another engine is one more section of the configs file (see its ``llamacpp`` note); nothing
here is vLLM-specific.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import optuna
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from autotune import names  # noqa: E402
from autotune.analysis.remeasure import Variant, measure_variants  # noqa: E402
from autotune.engines import build_engine  # noqa: E402
from autotune.errors import AutotuneError, SpecError  # noqa: E402
from autotune.space.load import load_space  # noqa: E402
from autotune.space.model import SearchSpace  # noqa: E402
from autotune.spec.load import load_spec  # noqa: E402
from autotune.spec.model import StudySpec  # noqa: E402
from autotune.storage import open_storage  # noqa: E402
from autotune.study.hardware import describe_machine  # noqa: E402
from autotune.study.loop import preflight, quiet_optuna  # noqa: E402

CONFIGS = ROOT / "benchmarks" / "gate_real_configs.yaml"
KEEP, REJECT, ERROR = "keep", "reject", "error"
#: a config whose right verdict is not known in advance: it moves the numerics by about as much
#: as the engine's own batch-shape drift, so keeping or rejecting it is each defensible. Its
#: verdict is reported and counted apart, never as a mistake.
EITHER = "either"


@dataclasses.dataclass(frozen=True)
class GateCase:
    """One configuration and the verdict a correct gate gives it."""

    name: str
    expect: str  # KEEP, REJECT or EITHER
    values: dict[str, Any]  # search-space values laid over the spec's baseline
    why: str = ""


def load_cases(path: Path, engine: str) -> tuple[StudySpec, list[GateCase]]:
    """The spec (its space extended by ``extra_parameters``) and the cases of ``engine``'s
    section; every case checked against the space before anything is launched."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    section = data.get(engine)
    if not isinstance(section, dict):
        raise SpecError(f"no section for engine {engine!r} (have: {sorted(data)})", file=str(path))
    spec = load_spec((path.parent / section["spec"]).resolve())
    extra = section.get("extra_parameters")
    if extra:
        spec = _with_parameters(spec, load_space((path.parent / extra).resolve()))
    cases = []
    for index, raw in enumerate(section.get("configs") or []):
        key = f"{engine}.configs[{index}]"
        if raw.get("expect") not in (KEEP, REJECT, EITHER):
            raise SpecError("expect must be keep, reject or either", file=str(path), key=key)
        case = GateCase(raw["name"], raw["expect"], dict(raw.get("set") or {}), raw.get("why", ""))
        problem = case_problem(spec.space, case)
        if problem:
            raise SpecError(f"{case.name}: {problem}", file=str(path), key=key)
        cases.append(case)
    names_seen = [c.name for c in cases]
    if len(set(names_seen)) != len(names_seen):
        raise SpecError("config names repeat", file=str(path), key=f"{engine}.configs")
    return spec, cases


def _with_parameters(spec: StudySpec, extra: SearchSpace) -> StudySpec:
    """The spec's space with ``extra``'s parameters: one of the same name replaces the spec's
    (a wider domain for the benchmark), and no two parameters may set one flag. A second
    parameter on a flag the spec already tunes is refused: the launch would carry the flag
    twice and the server keeps one of them, so a case could launch a config it does not name
    (how ``cache_type_k_more`` once launched q4_1 as f16)."""
    replaced = {p.name: p for p in extra.parameters}
    parameters = [replaced.pop(p.name, p) for p in spec.space.parameters]
    parameters += [p for p in extra.parameters if p.name in replaced]
    owner: dict[str, tuple[str, str | None]] = {}  # flag -> (parameter, its JSON key or None)
    for param in parameters:
        target = param.target
        if target.kind not in ("flag", "json"):
            continue
        key = target.key if target.kind == "json" else None
        for flag in filter(None, (target.name, target.false_flag)):
            other = owner.setdefault(flag, (param.name, key))
            # keys of one JSON flag are distinct settings; anything else on one flag collides
            if other[0] != param.name and (other[1] is None or key is None or other[1] == key):
                raise SpecError(
                    f"{flag} is set by both {other[0]!r} and {param.name!r}",
                    file=str(extra.path),
                    key=f"parameters.{param.name}.target",
                )
    space = SearchSpace(
        path=spec.space.path,
        parameters=tuple(parameters),
        constraints=spec.space.constraints + extra.constraints,
    )
    return dataclasses.replace(spec, space=space)


def case_values(space: SearchSpace, case: GateCase) -> dict[str, Any]:
    """The values a case's trial is pinned to: the baseline's, then the case's."""
    return {**space.baseline_values(), **case.values}


def case_problem(space: SearchSpace, case: GateCase) -> str | None:
    """Why ``case`` cannot be launched as written (unknown parameter, value outside its domain,
    a parameter inactive under the others, a broken constraint), or None."""
    values = case_values(space, case)
    for name, value in case.values.items():
        if name not in space.names:
            return f"no parameter {name!r} in the search space"
        param = space.parameter(name)
        if not param.contains(value):
            return f"{name}={value!r} is outside the parameter's domain"
        if not space.is_active(param, values):
            return f"{name} is inactive here (its `when` does not hold)"
    broken = space.violated(values)
    return f"breaks the constraint {broken[0]!r}" if broken else None


def verdict_of(outcome: Any) -> str:
    if outcome.verdict == names.CORRECT_VERDICT:
        return KEEP
    return ERROR if outcome.infrastructure else REJECT


def first_divergence_text(divergence: dict[str, Any] | None) -> str:
    if not divergence:
        return ""
    where = f"{divergence.get('prompt', '')[:30]!r} @{divergence.get('position')}"
    tokens = f"{divergence.get('expected_token')!r} -> {divergence.get('got_token')!r}"
    return f"{where} {divergence.get('kind')}: {tokens}"


def row_for(study: optuna.Study, case: GateCase, outcome: Any, wall_s: float) -> dict[str, Any]:
    """One config's result, from what its trial stored (the product's own record)."""
    attrs = study.trials[outcome.number].user_attrs
    check = attrs.get(names.CHECK) or {}
    divergence = (attrs.get(names.EVIDENCE) or {}).get("first_divergence")
    verdict = verdict_of(outcome)
    reason = outcome.verdict
    if verdict != KEEP and attrs.get(names.FAIL_DETAIL):
        reason = f"{outcome.verdict}: {attrs[names.FAIL_DETAIL]}"
    elif check.get("tie_flips"):
        reason = f"correct, {check['tie_flips']} near-tie flip(s) excused"
    return {
        "config": case.name,
        "expected": case.expect,
        "verdict": verdict,
        "mistake": verdict != ERROR and case.expect != EITHER and verdict != case.expect,
        "reason": " ".join(str(reason).split())[:300],
        "first_divergence": divergence,
        "first_divergent_token": first_divergence_text(divergence),
        "values": case.values,
        "why": case.why,
        "trial": outcome.number,
        "check": check,
        "startup_s": (attrs.get(names.SERVER) or {}).get("startup_s"),
        "output_tokens_per_s": (attrs.get(names.METRICS) or {}).get("output_tokens_per_s"),
        "wall_s": round(wall_s, 1),
    }


def counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    judged = [r for r in rows if r["verdict"] != ERROR]
    return {
        "configs": len(rows),
        "expected_keep": sum(r["expected"] == KEEP for r in rows),
        "expected_reject": sum(r["expected"] == REJECT for r in rows),
        "expected_either": sum(r["expected"] == EITHER for r in rows),
        "either_kept": sum(r["expected"] == EITHER and r["verdict"] == KEEP for r in judged),
        "false_rejects": sum(r["expected"] == KEEP and r["verdict"] == REJECT for r in judged),
        "false_accepts": sum(r["expected"] == REJECT and r["verdict"] == KEEP for r in judged),
        "errors": len(rows) - len(judged),
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    header = ("config", "expected", "verdict", "reason", "first divergent token")
    widths = (26, 8, 9, 72, 60)
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    for r in rows:
        mark = " !" if r["mistake"] else ""
        cells = (
            r["config"],
            r["expected"],
            r["verdict"] + mark,
            r["reason"],
            r["first_divergent_token"],
        )
        print("  ".join(str(c)[:w].ljust(w) for c, w in zip(cells, widths, strict=True)))
    c = counts(rows)
    print(
        f"\n{c['configs']} configs ({c['expected_keep']} keep, {c['expected_reject']} reject, "
        f"{c['expected_either']} either: {c['either_kept']} of them kept): "
        f"{c['false_rejects']} false rejects, {c['false_accepts']} false accepts, "
        f"{c['errors']} errors ('!' marks the gate's mistakes)"
    )


def write_result(out: Path, result: dict[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str) + "\n")
    tmp.replace(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--engine", default="vllm", help="the section of the configs file")
    parser.add_argument("--configs", type=Path, default=CONFIGS)
    parser.add_argument("--only", default="", help="comma-separated config names (a smoke run)")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--workdir", type=Path, default=None, help="study storage and server logs")
    args = parser.parse_args(argv)
    out = args.out or ROOT / "benchmarks" / "results" / f"gate_real_{args.engine}.json"
    try:
        spec, cases = load_cases(args.configs, args.engine)
        if args.only:
            wanted = [n.strip() for n in args.only.split(",") if n.strip()]
            unknown = sorted(set(wanted) - {c.name for c in cases})
            if unknown:
                raise SpecError(f"no such config(s): {unknown}", key="--only")
            cases = [c for c in cases if c.name in wanted]
        engine = build_engine(spec)
        dropped = preflight(spec, engine)
    except AutotuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2 if isinstance(exc, SpecError) else 3
    unrunnable = {(d.parameter, repr(d.value)): d.reason for d in dropped}
    quiet_optuna()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix=f"gate-real-{args.engine}-"))
    workdir.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{workdir / 'gate.db'}"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    study = optuna.create_study(
        storage=open_storage(url),
        study_name=f"gate-real-{args.engine}-{stamp}",
        directions=spec.objective.directions,
    )
    study.set_user_attr(names.SPEC_PATH, str(spec.path))
    print(f"gate on real numerics: {spec.model.path} on {spec.engine.kind} {engine.version()}")
    print(f"{len(cases)} configs; storage and server logs in {workdir}", flush=True)
    result: dict[str, Any] = {
        "what": "autotune's gate on a real model: configs whose right verdict is known, each "
        "launched as a gated trial (analysis.remeasure.measure_variants)",
        "engine": spec.engine.kind,
        "engine_version": engine.version(),
        "spec": str(spec.path.relative_to(ROOT))
        if spec.path.is_relative_to(ROOT)
        else str(spec.path),
        "model": spec.model.path,
        "configs_file": str(args.configs),
        "selected": args.only or "all",
        "started": stamp,
        "machine": describe_machine(),
        "rows": [],
    }

    def run(variant: Variant, role: str) -> tuple[Any, float]:
        started = time.perf_counter()
        measured = measure_variants(spec, study, url, [variant], repeats=1, role=role)
        return measured[variant.label].outcomes[-1], time.perf_counter() - started

    baseline, wall_s = run(
        Variant("baseline", spec.space.baseline_values(), role=names.BASELINE), names.BASELINE
    )
    if baseline.verdict != names.CORRECT_VERDICT:
        detail = study.trials[baseline.number].user_attrs.get(names.FAIL_DETAIL, "")
        print(f"the baseline failed ({baseline.verdict}: {detail}); nothing to judge against")
        return 1
    reference = study.user_attrs.get(names.REFERENCE) or {}
    result["reference"] = {
        key: reference.get(key) for key in ("tolerance", "drift_observed", "unstable_prompts")
    }
    result["baseline_wall_s"] = round(wall_s, 1)
    tolerance, drift = reference.get("tolerance", 0.0), reference.get("drift_observed", 0.0)
    print(
        f"baseline: correct in {wall_s:.0f} s; reference tolerance {tolerance:.4f} nats "
        f"(drift {drift:.4f}, {reference.get('unstable_prompts', 0)} prompts differ alone vs "
        f"batched)",
        flush=True,
    )
    for case in cases:
        values = case_values(spec.space, case)
        cannot = [unrunnable.get((k, repr(v))) for k, v in case.values.items()]
        if any(cannot):
            row = {
                "config": case.name,
                "expected": case.expect,
                "verdict": ERROR,
                "mistake": False,
                "reason": f"not run on this machine: {next(c for c in cannot if c)}",
                "first_divergence": None,
                "first_divergent_token": "",
                "values": case.values,
                "why": case.why,
            }
        else:
            outcome, wall_s = run(Variant(case.name, values), names.COMPARE)
            row = row_for(study, case, outcome, wall_s)
        result["rows"].append(row)
        result["counts"] = counts(result["rows"])
        write_result(out, result)
        print(
            f"{case.name}: expected {case.expect}, {row['verdict']} ({row['reason'][:100]})",
            flush=True,
        )
    result["counts"] = counts(result["rows"])
    write_result(out, result)
    print()
    print_table(result["rows"])
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
