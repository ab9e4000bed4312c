"""``--warm-start STUDY``: seed a study from another study's best verified configs.

The source is the same model on an older engine, or a smaller model on the same hardware. Its
best verified configs are enqueued as this study's first search trials, pinned: they are
launched and gated here like any other trial, so nothing measured elsewhere can be reported as
this study's best.
"""

from __future__ import annotations

from typing import Any

import optuna

from autotune import names
from autotune.errors import SpecError
from autotune.search.model import config_key
from autotune.space.model import SearchSpace
from autotune.storage import safe_url
from autotune.study.results import is_verified_feasible

#: trial attribute of a warm-start trial: where its config came from
WARM_START_FROM = "warm_start_from"
#: verified configs of the source study enqueued by ``--warm-start``
WARM_START_TOP = 3


def warm_start_configs(
    source: optuna.Study, space: SearchSpace, top: int = WARM_START_TOP
) -> list[tuple[int, dict[str, Any]]]:
    """The source study's best verified configs that this space can express: ``(trial number,
    parameter values)``, best first, duplicates and the baseline left out."""
    sign = 1.0 if source.direction == optuna.study.StudyDirection.MAXIMIZE else -1.0
    ranked = sorted(
        (t for t in source.get_trials(deepcopy=False) if is_verified_feasible(t)),
        key=lambda t: -sign * t.values[0],
    )
    known = set(space.names)
    out: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()
    for t in ranked:
        if t.user_attrs.get(names.ROLE) == "baseline":
            continue
        values = t.user_attrs.get(names.PARAMS_RESOLVED) or {
            name: space.parameter(name).from_optuna(v)
            for name, v in t.params.items()
            if name in known
        }
        values = {k: v for k, v in values.items() if k in known}
        if not values or not all(space.parameter(k).contains(v) for k, v in values.items()):
            continue
        if space.violated(values):
            continue
        key = config_key(values)
        if key in seen:
            continue
        seen.add(key)
        out.append((t.number, values))
        if len(out) >= top:
            break
    return out


def warm_start(
    study: optuna.Study, source: optuna.Study, space: SearchSpace, top: int = WARM_START_TOP
) -> list[str]:
    """Enqueue the source's best verified configs as pinned search trials (once per study).

    Returns one line per config enqueued. They run through the gate like any other trial."""
    done = study.user_attrs.get(WARM_START_FROM)
    if done is not None:
        return []
    lines = []
    for number, values in warm_start_configs(source, space, top):
        origin = f"{source.study_name}#{number}"
        study.enqueue_trial(
            space.to_optuna_params(values),
            user_attrs={names.ROLE: "search", names.PINNED: values, WARM_START_FROM: origin},
        )
        lines.append(f"warm start: queued {origin}")
    study.set_user_attr(WARM_START_FROM, source.study_name)
    return lines


def warm_start_from(study: optuna.Study, spec: Any, url: str, source_name: str) -> list[str]:
    """``--warm-start STUDY``: the named study of the same storage seeds this one."""
    if source_name == study.study_name:
        raise SpecError("a study cannot warm-start from itself", key="--warm-start")
    try:
        source = optuna.load_study(study_name=source_name, storage=study._storage)  # noqa: SLF001
    except KeyError:
        raise SpecError(
            f"no study named {source_name!r} in {safe_url(url)}", key="--warm-start"
        ) from None
    return warm_start(study, source, spec.space)
