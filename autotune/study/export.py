"""Write the best correct configuration in the engine's own terms.

The main file is autotune's ``#`` header (the verdict, the measurements, the environment, the
``# autotune-record:`` line that ``autotune recheck`` reads back, the launch command) and a body
the engine renders (``Engine.render_export``), with a ``.env`` file beside it. For vLLM the body
is a YAML file for ``vllm serve --config FILE`` (keys are long flag names, JSON flags nested
mappings) and the ``.env`` holds what cannot live in it; for llama.cpp, whose server reads no
config file, the body is a shell script that starts it and the ``.env`` holds its flags as its
own environment variables. Only verified, feasible trials are ever exported
(``report.best_trials``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from sqlalchemy.exc import ArgumentError

from autotune import names
from autotune._files import read_bounded, same_file, write_files_atomically
from autotune.bench.tokens import suspect_line
from autotune.engines import build_engine
from autotune.engines.base import Engine
from autotune.engines.export_files import EXPORT_API_KEY, ExportFiles, bash_word, env_path_for
from autotune.errors import SpecError
from autotune.gate.reference import describe_checks
from autotune.spec.model import StudySpec
from autotune.storage import sqlite_file
from autotune.study.results import (
    NO_CONFIRMED_WINNER,
    baseline_reason,
    best_trials,
    is_verified_feasible,
    snapshot,
    unconfirmed_gain,
    verified_baseline,
)

#: the header line of every exported file that ``autotune recheck`` reads back
RECORD_PREFIX = "# autotune-record: "
#: what an error about the record names as its key (``autotune-record.spec``)
RECORD_KEY = "autotune-record"
RECORD_VERSION = 1


@dataclass(frozen=True)
class ExportResult:
    path: Path
    trial_number: int
    config: dict[str, Any]
    env: dict[str, str]
    command: list[str]
    #: the .env written beside it (always: empty when the config needs no environment)
    env_path: Path
    #: why the baseline was exported (no configuration beat it), None for a winner
    baseline_reason: str | None = None
    #: why the exported trial is NOT a confirmed gain (``--allow-unconfirmed``: the best
    #: measured config), None for the baseline and for a confirmed winner
    not_confirmed: str | None = None


def evidence_notes(trial: optuna.trial.FrozenTrial) -> tuple[str, ...]:
    """Header lines for what makes the trial's figures doubtful: a token count the server and
    autotune disagree on, a host that other work kept busy while it was measured."""
    notes = []
    suspect = trial.user_attrs.get(names.MEASUREMENT_SUSPECT)
    if suspect:
        notes.append("# " + suspect_line(suspect))
    host = trial.user_attrs.get(names.HOST) or {}
    if host.get("noisy"):
        notes.append("# measured on a noisy host: " + "; ".join(host.get("reasons") or ()))
    return tuple(notes)


def _export_baseline(
    spec: StudySpec, base: optuna.trial.FrozenTrial, out: Path, reason: str
) -> ExportResult:
    """The baseline written as the study's answer, with why no other config took its place."""
    return export_trial(
        spec,
        base,
        out,
        baseline_reason=reason,
        baseline_metrics=base.user_attrs.get(names.METRICS) or None,
    )


def export_trial(
    spec: StudySpec,
    trial: optuna.trial.FrozenTrial,
    out: Path,
    *,
    baseline_reason: str | None = None,
    baseline_metrics: dict[str, float] | None = None,
    confirmation: dict[str, Any] | None = None,
    not_confirmed: str | None = None,
) -> ExportResult:
    """Export one trial. ``not_confirmed`` (why it is not a confirmed gain) makes the header's
    first line say so: the best measured config is then not presented as a win."""
    values = {}
    for name, value in (trial.user_attrs.get(names.PARAMS_RESOLVED) or trial.params).items():
        values[name] = spec.space.parameter(name).from_optuna(value)
    metrics = trial.user_attrs.get(names.METRICS) or {}
    if baseline_reason is not None:
        title = (
            f"the BASELINE (trial {trial.number}): {NO_CONFIRMED_WINNER}"
            if baseline_reason.startswith(NO_CONFIRMED_WINNER)
            else f"the BASELINE (trial {trial.number}): no configuration beat it"
        )
        found = (
            "# space's baseline values); no correct config's gain over it is confirmed."
            if baseline_reason.startswith(NO_CONFIRMED_WINNER)
            else "# space's baseline values); the tuner found no correct config that is faster."
        )
        notes = (
            f"# Why the baseline: {baseline_reason}.",
            "# It is the reference every trial was verified against (engine defaults plus the",
            found,
        )
    elif not_confirmed is not None:
        title = (
            f"trial {trial.number}, the best MEASURED config, NOT a confirmed gain: "
            f"{not_confirmed} (verified correct against the baseline's reference)"
        )
        notes = confirmation_notes(confirmation, trial.number)
    else:
        title = f"trial {trial.number} (verified correct against the baseline's reference)"
        notes = confirmation_notes(confirmation, trial.number)
    notes = (*notes, *evidence_notes(trial))
    result = export_values(
        spec,
        values,
        out,
        number=trial.number,
        metrics=metrics,
        title=title,
        notes=notes,
        verified=describe_checks(trial.user_attrs.get(names.CHECK)),
        baseline_metrics=baseline_metrics,
        engine_version=(trial.user_attrs.get(names.SERVER) or {}).get("engine_version"),
    )
    return dataclasses.replace(result, baseline_reason=baseline_reason, not_confirmed=not_confirmed)


def confirmation_notes(confirmation: dict[str, Any] | None, number: int) -> tuple[str, ...]:
    """Header lines with the confirmation's verdict on the exported trial: its gain over the
    baseline and the 95% interval, and whether that is a confirmed gain. Without them a config
    whose interval includes zero (the confirmation said "no confirmed gain") was exported with
    only its single search measurement, which reads like a win."""
    if not confirmation or confirmation.get("winner") != number:
        return ()
    gain, ci = confirmation.get("gain"), confirmation.get("gain_ci")
    if gain is None or not ci:
        return ()
    low, high = ci
    verdict = (
        "a confirmed gain"
        if low > 0
        else "NOT a confirmed gain: the interval includes no change; it is verified correct, "
        "and may be no faster than the baseline"
    )
    return (
        f"# Confirmation ({confirmation.get('repeats')} interleaved rounds against the baseline, "
        f"{confirmation.get('metric')}): {gain:+.1%}, 95% CI {low:+.1%} .. {high:+.1%}",
        f"#   {verdict}",
    )


def export_values(
    spec: StudySpec,
    values: dict[str, Any],
    out: Path,
    *,
    title: str,
    number: int = -1,
    metrics: dict[str, float] | None = None,
    notes: tuple[str, ...] = (),
    verified: str | None = None,
    baseline_metrics: dict[str, float] | None = None,
    engine_version: str | None = None,
) -> ExportResult:
    """Write parameter ``values`` as the engine's config file, with env and launch command.

    The header's ``# autotune-record:`` line is what ``autotune recheck`` reads back."""
    check_output(spec, out)
    engine = build_engine(spec)
    settings = spec.space.resolve(values)
    files = render_files(spec, engine, values, out)
    metrics = metrics or {}
    header = [f"# autotune export: study {spec.name}, {title}", *notes]
    if verified:
        header.append(f"# Checks passed: {verified}")
    for name in spec.objective.metrics:
        if name in metrics:
            header.append(f"#   {name}: {metrics[name]}")
    if files.env:
        header.append("# Environment this config needs (also in the .env file beside it):")
        header += [f"#   {k}={v}" for k, v in files.env.items()]
    if settings.patches:
        header.append(f"# Patches (applied by autotune's vLLM plugin): {dict(settings.patches)}")
    header.append(
        record_line(
            study=spec.name,
            spec_path=spec.path,
            values=values,
            metrics=metrics,
            baseline_metrics=baseline_metrics,
            engine_version=engine_version,
            objective=spec.objective.metrics,
            trial=number,
        )
    )
    header.append("# Launch:")
    words = [f"{k}={bash_word(v)}" for k, v in files.launch_env.items()]
    header.append("#   " + " ".join(words + [bash_word(c) for c in files.command]))
    text = "\n".join(header) + "\n" + files.body
    # The config and its .env are one export: both are written, or neither. A config that
    # needs no environment still gets its (empty) .env, so an older export's .env never
    # stands beside it as if it belonged to it.
    env_path = env_path_for(out)
    write_files_atomically({out: text, env_path: files.env_text}, option="--output")
    return ExportResult(
        path=out,
        trial_number=number,
        config=files.config,
        env=files.env,
        command=files.command,
        env_path=env_path,
    )


def check_output(
    spec: StudySpec, out: Path, *, storage_url: str | None = None, option: str = "--output"
) -> None:
    """Refuse (SpecError, exit 2, nothing written) an output that would overwrite its own .env
    or a file the study is made of: the spec, its search space, its workload file, its SQLite
    storage (``storage_url``, the spec's own when None). Paths are compared resolved."""
    try:
        env_path = env_path_for(out)
    except ValueError:  # a name with no file name in it: "/", "."
        raise SpecError(f"{out} names no file to write", key=option) from None
    if same_file(out, env_path):
        raise SpecError(
            f"{out} would be both the config and the .env file written beside it: give the "
            f"config another suffix (e.g. {out.with_suffix(build_engine(spec).export_suffix)})",
            key=option,
        )
    for target in (out, env_path):
        for path, what in _study_files(spec, storage_url):
            if same_file(target, path):
                written = "" if target == out else f" (the .env beside {out})"
                shown = "" if str(target) == str(path) else f" ({path})"
                raise SpecError(
                    f"{target}{written} is {what}{shown}: exporting there would overwrite "
                    "it; choose another file",
                    key=option,
                )


#: how ``spec.workload.source`` names a prompt file (autotune/spec/workload.py)
_WORKLOAD_FILE = re.compile(r"file (.+?)(?: \(\d+ records without a human turn skipped\))?")


def _study_files(spec: StudySpec, storage_url: str | None) -> list[tuple[Path, str]]:
    files = [(spec.path, "the study spec"), (spec.space.path, "the search-space file")]
    workload = _WORKLOAD_FILE.fullmatch(spec.workload.source)
    if workload:
        files.append((Path(workload.group(1)), "the workload file"))
    try:
        database = sqlite_file(storage_url or spec.storage or spec.default_storage())
    except (ValueError, ArgumentError):  # a bad URL is refused where the storage is opened
        database = None
    if database is not None:
        files += [
            (database.with_name(database.name + end), "the study's SQLite storage")
            for end in ("", "-journal", "-wal", "-shm")
        ]
    return files


def render_files(spec: StudySpec, engine: Engine, values: dict[str, Any], out: Path) -> ExportFiles:
    """What an export of ``values`` to ``out`` holds, in the engine's terms (written by
    :func:`export_values`, read back against by ``autotune compare``)."""
    settings = spec.space.resolve(values)
    # A spec's ``{api_key}`` (command engine env) is the user's own key at launch time.
    env = {k: v.replace("{api_key}", EXPORT_API_KEY) for k, v in spec.engine.env.items()}
    env.update(settings.env)
    env.update(engine.patch_env(settings))
    return engine.render_export(settings, env, out)


def default_output(spec: StudySpec) -> Path:
    """The file ``autotune export`` writes when no ``-o`` names one: ``best`` with the engine's
    suffix (``best.yaml`` for a config file, ``best.sh`` for a launch script)."""
    return Path("best" + build_engine(spec).export_suffix)


def export_best(
    spec: StudySpec,
    study: optuna.Study,
    out: Path,
    *,
    pareto: bool = False,
    require_confirmed: bool = True,
    storage_url: str | None = None,
) -> list[ExportResult]:
    """Export the confirmed winner (single objective) or the Pareto front (``pareto``).

    When no configuration beat the baseline (``report.baseline_reason``, which includes a
    confirmation whose interval includes no change), the baseline's own config is exported with
    a header saying so: it is verified by definition, and a study whose search found nothing
    better ran correctly. A study whose baseline failed exports nothing.

    ``require_confirmed=False`` (``--allow-unconfirmed``) asks for the best measured config: the
    confirmation's winner whose interval includes no change, or the best search trial of a
    study never confirmed; its header's first line then says it is NOT a confirmed gain.

    An output that would overwrite its own .env or a file of the study (``check_output``, with
    the study's ``storage_url``) is refused before anything is written.
    """
    check_output(spec, out, storage_url=storage_url)
    trials = snapshot(study)  # one read: a live study's next trial cannot split the answer
    reason = baseline_reason(study, trials=trials)
    confirmation = study.user_attrs.get(names.CONFIRMATION)
    if not require_confirmed and not pareto and unconfirmed_gain(confirmation) is not None:
        winner = next(
            (t for t in trials if t.number == confirmation["winner"] and is_verified_feasible(t)),
            None,
        )
        if winner is not None:
            low, high = confirmation["gain_ci"]
            base = verified_baseline(study, trials=trials)
            return [
                export_trial(
                    spec,
                    winner,
                    out,
                    baseline_metrics=(base.user_attrs.get(names.METRICS) or None) if base else None,
                    confirmation=confirmation,
                    not_confirmed=(
                        f"the confirmation measured {confirmation['gain']:+.1%}, 95% CI "
                        f"{low:+.1%} .. {high:+.1%}, which includes no change"
                    ),
                )
            ]
    if reason is not None and not pareto:
        return [_export_baseline(spec, verified_baseline(study, trials=trials), out, reason)]
    best = best_trials(study, trials=trials)
    if not best:
        raise SpecError(
            f"study {study.study_name!r} has no verified correct trial to export", key="--study"
        )
    if len(study.directions) == 1 and require_confirmed:
        skipped = study.user_attrs.get(names.CONFIRMATION_SKIPPED)
        base = verified_baseline(study, trials=trials)
        if confirmation is None and skipped and base is not None:
            # `autotune run` planned no confirmation: its verdict is that the baseline stands
            why = (
                f"{NO_CONFIRMED_WINNER} ({skipped}; the best measured config, trial "
                f"{best[0].number}, was measured once and never confirmed: `autotune confirm` "
                "measures it again, `autotune export --allow-unconfirmed` writes it)"
            )
            return [_export_baseline(spec, base, out, why)]
        if confirmation is None:
            raise SpecError(
                "the best config has not been confirmed yet (run `autotune confirm`"
                ", or pass --allow-unconfirmed)",
                key="--study",
            )
        if confirmation.get("winner") is None:
            raise SpecError(
                "no candidate passed every confirmation round; nothing is "
                "exported (see `autotune show`)",
                key="--study",
            )
    if len(best) > 1 and not pareto:
        raise SpecError(
            "this study has several objectives: its best is a Pareto front; "
            "use --pareto to export every config on it",
            key="--pareto",
        )
    base = verified_baseline(study, trials=trials)
    base_metrics = (base.user_attrs.get(names.METRICS) or None) if base is not None else None
    if not pareto:
        not_confirmed = None
        if confirmation is None and len(study.directions) == 1:
            not_confirmed = (
                "no confirmation ran (`autotune confirm`): its single measurement may be the "
                "luckiest one"
            )
        return [
            export_trial(
                spec,
                best[0],
                out,
                baseline_metrics=base_metrics,
                confirmation=confirmation,
                not_confirmed=not_confirmed,
            )
        ]
    suffix = out.suffix or build_engine(spec).export_suffix
    paths = [out.with_name(f"{out.stem}-trial{trial.number}{suffix}") for trial in best]
    for path in paths:  # every one before the first is written
        check_output(spec, path, storage_url=storage_url)
    return [
        export_trial(spec, trial, path, baseline_metrics=base_metrics)
        for trial, path in zip(best, paths, strict=True)
    ]


def record_line(
    *,
    study: str,
    spec_path: Path | str,
    values: Mapping[str, Any],
    metrics: Mapping[str, float],
    baseline_metrics: Mapping[str, float] | None,
    engine_version: str | None,
    objective: Sequence[str],
    trial: int,
) -> str:
    """The one header line ``autotune recheck`` reads back (one line of JSON, no newlines)."""
    record = {
        "version": RECORD_VERSION,
        "study": study,
        "spec": str(Path(spec_path).resolve()),
        "trial": trial,
        "values": dict(values),
        "objective": list(objective),
        "metrics": dict(metrics),
        "baseline_metrics": dict(baseline_metrics) if baseline_metrics else None,
        "engine_version": engine_version,
    }
    return RECORD_PREFIX + json.dumps(record, sort_keys=True, separators=(",", ":"))


#: the largest exported file ``autotune recheck`` reads (one is a few KiB)
MAX_EXPORT_BYTES = 1 << 20


def read_record(path: Path) -> dict[str, Any]:
    """The record of an exported file; a :class:`SpecError` (exit 2) naming the file otherwise.

    Every malformed record is that one error, never a traceback: a file that is not UTF-8, a
    number Python will not convert (over 4300 digits), nesting deeper than the parser goes, a
    field of the wrong type (``"spec": 5``). The record returned holds only the fields
    :func:`record_line` writes, each of the type it writes."""
    raw = read_bounded(path, what="exported config", limit=MAX_EXPORT_BYTES)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): "
            "not a file written by `autotune export`",
            file=str(path),
        ) from None
    for line in text.splitlines():
        if not line.startswith("#"):
            break  # the header ends where the engine's body starts
        if line.startswith(RECORD_PREFIX):
            return _checked_record(_parse_record(line[len(RECORD_PREFIX) :], path), path)
    raise SpecError(
        "no '# autotune-record:' line in the header: not written by `autotune export` "
        "(or exported before recheck existed; export it again)",
        file=str(path),
    )


def _parse_record(text: str, path: Path) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        why = f"{exc.msg} (column {exc.colno})"
    except RecursionError:
        why = "nested too deeply"
    except ValueError as exc:  # an integer of more digits than Python converts
        why = str(exc).split(";")[0]
    raise SpecError(f"malformed record line: {why}", file=str(path), key=RECORD_KEY)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, str | bool | int | float)


def _checked_record(record: Any, path: Path) -> dict[str, Any]:
    """``record`` with the fields :func:`record_line` writes, each checked for its type."""

    def bad(field: str, what: str) -> SpecError:
        return SpecError(f"must be {what}", file=str(path), key=f"{RECORD_KEY}.{field}")

    if not isinstance(record, dict):
        raise SpecError("must be a JSON object", file=str(path), key=RECORD_KEY)
    values = record.get("values")
    if not isinstance(values, dict):
        raise SpecError("has no parameter values", file=str(path), key=f"{RECORD_KEY}.values")
    for name, value in values.items():
        if not (_is_scalar(value) or (isinstance(value, list) and all(map(_is_scalar, value)))):
            raise bad(f"values.{name}", "a parameter value (a string, number, bool or null)")
    spec = record.get("spec")
    if spec is not None and (not isinstance(spec, str) or not spec or "\0" in spec):
        raise bad("spec", "the path of the study spec, a string")
    for field in ("metrics", "baseline_metrics"):
        figures = record.get(field)
        if figures is not None and (
            not isinstance(figures, dict) or not all(map(_is_number, figures.values()))
        ):
            raise bad(field, "an object of metric names and numbers")
    for field in ("study", "engine_version"):
        if record.get(field) is not None and not isinstance(record[field], str):
            raise bad(field, "a string")
    for field in ("version", "trial"):
        if record.get(field) is not None and not (
            isinstance(record[field], int) and not isinstance(record[field], bool)
        ):
            raise bad(field, "an integer")
    objective = record.get("objective")
    if objective is not None and (
        not isinstance(objective, list) or not all(isinstance(m, str) for m in objective)
    ):
        raise bad("objective", "a list of metric names")
    known = (
        "version",
        "study",
        "spec",
        "trial",
        "values",
        "objective",
        "metrics",
        "baseline_metrics",
        "engine_version",
    )
    return {k: record[k] for k in known if k in record}
