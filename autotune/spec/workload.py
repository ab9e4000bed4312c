"""Workloads: which requests a benchmark sends, built once from the spec and pinned by a hash.

A study's figures are only comparable when every trial was measured with the same requests, so
the workload is materialised when the spec is loaded (never per trial) and its content hash is
stored in the study: a resumed study whose workload changed is refused (exit 2) unless the user
says ``--allow-workload-change`` (the change is then recorded in the study).

Three sources, exactly one per spec (``workload.prompts``, ``workload.file``,
``workload.synthetic``):

* **inline** ``prompts``: the strings, each answered with ``max_tokens`` tokens (as before);
* **file**: JSONL, one request per line, in any of three shapes::

      {"prompt": "text", "max_tokens": 128}          # max_tokens optional
      {"messages": [{"role": "user", "content": "text"}, ...]}
      {"conversations": [{"from": "human", "value": "text"}, {"from": "gpt", ...}]}  # ShareGPT

  (a file holding one JSON array of such objects, as ShareGPT is published, is read too).
  Chat messages are rendered with the model tokenizer's chat template when it has one, else as
  ``role: content`` lines ending in ``assistant:`` (which was used is stored). A ShareGPT record
  is its first human turn; records with no human turn are skipped and counted. A line that is not
  JSON or not one of these shapes is a :class:`SpecError` naming the file and the line.
* **synthetic**: ``count`` prompts of random common words with input and output lengths drawn
  from distributions (a number: fixed; ``{dist: uniform, min, max}``; ``{dist: normal, mean,
  std}``) from ``seed``; ``shared_prefix`` (0 <= f < 1) makes the first f of every prompt one
  common text (a prefix cache can serve it). Lengths are tokens of the model's own tokenizer
  when it loads from the model folder (``unit: auto``, the default, or ``tokens``), else words
  (``unit: words``, or ``auto`` without a tokenizer); ``length_unit`` says which was used. Token
  lengths are approximate: text is cut at the target id count and decoded, and re-encoding it can
  differ by a token or two.

Output lengths are exact on the server: every request is greedy with ``ignore_eos``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune import names
from autotune._files import MAX_WORKLOAD_BYTES, read_bounded
from autotune._yaml import MAX_COUNT
from autotune._yaml import SURROGATE as _SURROGATE
from autotune.errors import SpecError

#: WorkloadSpec fields that say how long or how often to measure, not what is measured: a
#: change of these keeps a study's trials comparable, so they stay out of the hash. Every other
#: field (prompts, lengths, concurrency, request count, anything added later) is hashed.
NOT_HASHED = frozenset(
    {
        "repeats",
        "warmup_requests",
        "single_requests",
        "request_timeout_s",
        "target_precision",
        "max_measure_s",
        "max_repeats",
        "source",
        "length_unit",
        "chat_format",
    }
)
UNITS = ("auto", "tokens", "words")
#: bounds on a synthetic workload, so that a hostile or mistyped spec is refused at once instead
#: of generating for hours: prompts (building one costs about 20 ms with the tokenizer on a busy
#: 2-core machine), tokens of one prompt (more than any model's context), tokens in all
SYNTHETIC_MAX_COUNT = 10_000
SYNTHETIC_MAX_LENGTH = 1_000_000
SYNTHETIC_MAX_TOTAL = 20_000_000
#: the request body fields that do not come from the spec: part of every hash
SAMPLING = {"temperature": 0.0, "ignore_eos": True}

_WORD_TEXT = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education foot boy age policy music market sense nation plan college interest death "
    "experience effect class control care field development role effort rate heart drug show "
    "leader light voice wife police mind price report decision son view relationship town road"
)
_WORDS = tuple(_WORD_TEXT.split())


@dataclass(frozen=True)
class BuiltWorkload:
    """The requests of a workload: prompt i is answered with ``output_tokens[i]`` tokens
    (empty: every prompt with ``max_tokens``)."""

    prompts: tuple[str, ...]
    output_tokens: tuple[int, ...] = ()
    source: str = "inline"
    length_unit: str | None = None
    chat_format: str | None = None


@dataclass(frozen=True)
class LengthDist:
    """A length distribution: ``fixed`` (a), ``uniform`` (a..b), ``normal`` (mean a, std b)."""

    kind: str
    a: float
    b: float = 0.0

    def sample(self, rng: random.Random) -> int:
        if self.kind == "fixed":
            value = self.a
        elif self.kind == "uniform":
            value = rng.randint(int(self.a), int(self.b))
        else:
            value = rng.gauss(self.a, self.b)
        return max(1, round(value))

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    @property
    def high(self) -> float:
        """A length the draws (practically) never exceed."""
        if self.kind == "fixed":
            return self.a
        return self.b if self.kind == "uniform" else self.a + 4 * self.b

    def describe(self) -> str:
        if self.kind == "fixed":
            return f"{self.a:g}"
        if self.kind == "uniform":
            return f"uniform {self.a:g}..{self.b:g}"
        return f"normal mean {self.a:g} std {self.b:g}"


# --- building from the spec ------------------------------------------------------------------


def build(doc: Any, raw: dict[str, Any], base: Path, model: Any) -> BuiltWorkload:
    """The workload section's requests. ``doc`` is the spec's YamlDoc (errors name its keys),
    ``model`` its ModelSpec (the tokenizer for chat templates and token lengths)."""
    given = [k for k in ("prompts", "file", "synthetic") if k in raw]
    if len(given) != 1:
        raise doc.error(
            "workload",
            "give exactly one of prompts (a list), file (JSONL) or synthetic "
            f"(got {', '.join(given) or 'none'})",
        )
    tokenizer = _Tokenizer(model)
    if "file" in raw:
        return _from_file(doc, raw, base, tokenizer)
    if "synthetic" in raw:
        return _synthetic(doc, raw["synthetic"], tokenizer)
    prompts = raw["prompts"]
    if not isinstance(prompts, list) or not prompts:
        raise doc.error("workload.prompts", "must be a non-empty list of non-empty strings")
    if not all(isinstance(p, str) and p for p in prompts):
        raise doc.error("workload.prompts", "must be a non-empty list of non-empty strings")
    return BuiltWorkload(prompts=tuple(prompts))


def _from_file(doc: Any, raw: dict[str, Any], base: Path, tokenizer: _Tokenizer) -> BuiltWorkload:
    rel = raw["file"]
    if not isinstance(rel, str) or not rel:
        raise doc.error("workload.file", "must be a path to a JSONL file")
    path = (base / rel).resolve()
    if not path.exists():
        raise doc.error("workload.file", f"file not found: {path}")
    limit = raw.get("limit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise doc.error("workload.limit", f"must be a positive integer, got {limit!r}")
    prompts, lengths, skipped, chat = read_prompt_file(path, tokenizer, limit=limit)
    if not prompts:
        raise SpecError(
            "no prompts in the file"
            + (f" ({skipped} records had no human turn)" if skipped else ""),
            file=str(path),
            key="workload.file",
        )
    source = f"file {path}" + (f" ({skipped} records without a human turn skipped)" * bool(skipped))
    return BuiltWorkload(
        prompts=tuple(prompts),
        output_tokens=tuple(lengths) if any(n is not None for n in lengths) else (),
        source=source,
        chat_format=chat,
    )


#: The most records (lines, or array items) a workload file may hold; with the file's size bound
#: (``_files.MAX_WORKLOAD_BYTES``, 64 MiB) this bounds what reading one costs.
MAX_WORKLOAD_RECORDS = 1_000_000


def read_prompt_file(
    path: Path, tokenizer: _Tokenizer | None = None, *, limit: int | None = None
) -> tuple[list[str], list[int | None], int, str | None]:
    """(prompts, per-prompt max_tokens or None, records skipped, chat format used or None).

    Raises :class:`SpecError` naming the file and the line (or array item) of the first bad
    record.
    """
    tokenizer = tokenizer or _Tokenizer(None)
    raw = read_bounded(path, what="workload", limit=MAX_WORKLOAD_BYTES, key="workload.file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"cannot read: {exc}", file=str(path), key="workload.file") from None
    records: list[tuple[int, str, Any]] = []  # (line, where, parsed)
    if text.lstrip().startswith("["):
        items = _json(text, path, 0)
        if isinstance(items, list) and len(items) > MAX_WORKLOAD_RECORDS:
            raise SpecError(
                f"more than {MAX_WORKLOAD_RECORDS} records; a workload file holds no more",
                file=str(path),
                key="workload.file",
            )
        records = [(0, f"item {i}", item) for i, item in enumerate(items)]
    else:
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            if len(records) >= MAX_WORKLOAD_RECORDS:
                raise SpecError(
                    f"more than {MAX_WORKLOAD_RECORDS} records; a workload file holds at most "
                    "that many (use workload.limit on a smaller file)",
                    file=str(path),
                    line=number,
                    key="workload.file",
                )
            records.append((number, "", _json(line, path, number)))
    prompts: list[str] = []
    lengths: list[int | None] = []
    skipped = 0
    chat: str | None = None
    for number, where, record in records:

        def bad(message: str, number: int = number, where: str = where) -> SpecError:
            return SpecError(message, file=str(path), line=number or None, key=where or None)

        if not isinstance(record, dict):
            raise bad(f"expected a JSON object, got {type(record).__name__}")
        max_tokens = record.get("max_tokens")
        if max_tokens is not None and (
            isinstance(max_tokens, bool)
            or not isinstance(max_tokens, int)
            or not 1 <= max_tokens <= MAX_COUNT
        ):
            raise bad(
                f"max_tokens must be a positive integer up to {MAX_COUNT:,}, got {max_tokens!r}"
            )
        if "prompt" in record:
            prompt = record["prompt"]
            if not isinstance(prompt, str) or not prompt:
                raise bad("prompt must be a non-empty string")
        elif "messages" in record:
            messages = record["messages"]
            if not (
                isinstance(messages, list)
                and messages
                and all(
                    isinstance(m, dict)
                    and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)
                    for m in messages
                )
            ):
                raise bad('messages must be a non-empty list of {"role": ..., "content": ...}')
            prompt, chat = tokenizer.render_chat(messages)
        elif "conversations" in record:
            turns = record["conversations"]
            if not isinstance(turns, list) or not all(
                isinstance(t, dict) and isinstance(t.get("value"), str) for t in turns
            ):
                raise bad('conversations must be a list of {"from": ..., "value": ...}')
            human = [t["value"] for t in turns if t.get("from") in ("human", "user") and t["value"]]
            if not human:
                skipped += 1
                continue
            prompt = human[0]
        else:
            raise bad(
                'expected "prompt", "messages" or "conversations" (ShareGPT), got keys '
                + ", ".join(sorted(map(str, record))[:6])
            )
        if _SURROGATE.search(prompt):  # no text: the request (and the workload hash) raised
            raise bad("the prompt has a lone surrogate (an escape such as \\ud800), not text")
        prompts.append(prompt)
        lengths.append(max_tokens)
        if limit is not None and len(prompts) >= limit:
            break
    return prompts, lengths, skipped, chat


def _json(text: str, path: Path, line: int) -> Any:
    """One JSON value of the prompt file (``line`` 0: the whole file, an array). Nesting a few
    thousand deep raised RecursionError, and an integer of over 4300 digits ValueError: both
    tracebacks."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        where = exc.lineno if line == 0 else line
        raise SpecError(f"not JSON: {exc.msg}", file=str(path), line=where) from None
    except (ValueError, RecursionError) as exc:
        why = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        raise SpecError(f"not JSON: {why}", file=str(path), line=line or None) from None


def _distribution(doc: Any, key: str, raw: Any) -> LengthDist:
    if isinstance(raw, int) and not isinstance(raw, bool):
        if raw < 1:
            raise doc.error(key, f"must be >= 1, got {raw!r}")
        return _bounded(doc, key, LengthDist("fixed", raw))
    if not isinstance(raw, dict):
        raise doc.error(key, "a number, {dist: uniform, min, max} or {dist: normal, mean, std}")
    kind = raw.get("dist")
    needed = {"uniform": ("min", "max"), "normal": ("mean", "std")}
    if kind not in needed:
        raise doc.error(f"{key}.dist", f"one of uniform, normal, got {kind!r}")
    extra = set(raw) - {"dist", *needed[kind]}
    if extra:
        raise doc.error(f"{key}.{sorted(extra)[0]}", f"unknown key for dist {kind}")
    values = []
    for name in needed[kind]:
        value = raw.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise doc.error(f"{key}.{name}", f"must be a number, got {value!r}")
        if not math.isfinite(value):
            raise doc.error(f"{key}.{name}", f"must be a finite number, got {value!r}")
        values.append(float(value))
    a, b = values
    if kind == "uniform" and not (1 <= a <= b):
        raise doc.error(key, f"needs 1 <= min <= max, got min {a:g}, max {b:g}")
    if kind == "normal" and (a < 1 or b < 0):
        raise doc.error(key, f"needs mean >= 1 and std >= 0, got mean {a:g}, std {b:g}")
    return _bounded(doc, key, LengthDist(kind, a, b))


def _bounded(doc: Any, key: str, dist: LengthDist) -> LengthDist:
    if dist.high > SYNTHETIC_MAX_LENGTH:
        raise doc.error(
            key, f"{dist.describe()} reaches over {SYNTHETIC_MAX_LENGTH:,} tokens per prompt"
        )
    return dist


def _synthetic(doc: Any, raw: Any, tokenizer: _Tokenizer) -> BuiltWorkload:
    keys = {"count", "input_tokens", "output_tokens", "shared_prefix", "seed", "unit"}
    if not isinstance(raw, dict):
        raise doc.error("workload.synthetic", "must be a mapping")
    for key in raw:
        if key not in keys:
            raise doc.error(f"workload.synthetic.{key}", f"unknown key (one of {sorted(keys)})")
    count = raw.get("count", 64)
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise doc.error("workload.synthetic.count", f"must be a positive integer, got {count!r}")
    if count > SYNTHETIC_MAX_COUNT:
        raise doc.error(
            "workload.synthetic.count", f"at most {SYNTHETIC_MAX_COUNT:,} prompts, got {count:,}"
        )
    if "input_tokens" not in raw:
        raise doc.error("workload.synthetic.input_tokens", "required")
    inputs = _distribution(doc, "workload.synthetic.input_tokens", raw["input_tokens"])
    outputs = (
        _distribution(doc, "workload.synthetic.output_tokens", raw["output_tokens"])
        if "output_tokens" in raw
        else None
    )
    if count * inputs.mean > SYNTHETIC_MAX_TOTAL:
        raise doc.error(
            "workload.synthetic",
            f"{count:,} prompts of {inputs.describe()} tokens is over "
            f"{SYNTHETIC_MAX_TOTAL:,} prompt tokens in all",
        )
    prefix = raw.get("shared_prefix", 0.0)
    if isinstance(prefix, bool) or not isinstance(prefix, int | float) or not 0 <= prefix < 1:
        raise doc.error("workload.synthetic.shared_prefix", f"must be 0 <= f < 1, got {prefix!r}")
    seed = raw.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise doc.error("workload.synthetic.seed", f"must be an integer, got {seed!r}")
    unit = raw.get("unit", "auto")
    if unit not in UNITS:
        raise doc.error("workload.synthetic.unit", f"one of {', '.join(UNITS)}, got {unit!r}")
    if unit == "tokens" and not tokenizer.available:
        raise doc.error(
            "workload.synthetic.unit",
            f"tokens needs the model's tokenizer, which did not load: {tokenizer.why_not}",
        )
    use_tokens = unit != "words" and tokenizer.available
    prompts, lengths = synthesize(
        count,
        inputs,
        outputs,
        shared_prefix=float(prefix),
        seed=seed,
        tokenizer=tokenizer if use_tokens else None,
    )
    length_unit = (
        f"tokens ({tokenizer.name} tokenizer; approximate)"
        if use_tokens
        else "words" + ("" if unit == "words" else f" (no tokenizer: {tokenizer.why_not})")
    )
    described = f"input {inputs.describe()}" + (f", output {outputs.describe()}" if outputs else "")
    return BuiltWorkload(
        prompts=tuple(prompts),
        output_tokens=tuple(lengths) if outputs else (),
        source=f"synthetic {count} prompts, {described}, shared prefix {prefix:g}, seed {seed}",
        length_unit=length_unit,
    )


def synthesize(
    count: int,
    inputs: LengthDist,
    outputs: LengthDist | None,
    *,
    shared_prefix: float = 0.0,
    seed: int = 0,
    tokenizer: _Tokenizer | None = None,
) -> tuple[list[str], list[int]]:
    """``count`` prompts of random words and their output lengths (see the module docstring).

    Deterministic in ``seed``: the same spec gives the same prompts on every machine (with the
    same tokenizer), hence the same hash.
    """
    rng = random.Random(seed)
    in_lengths = [inputs.sample(rng) for _ in range(count)]
    out_lengths = [outputs.sample(rng) if outputs else 0 for _ in range(count)]
    longest = max(in_lengths)
    common = [rng.choice(_WORDS) for _ in range(longest + 8)]
    prompts = []
    for length in in_lengths:
        shared = round(shared_prefix * length)
        own = [rng.choice(_WORDS) for _ in range(length - shared + 8)]
        if tokenizer is None:
            prompts.append(" ".join(common[:shared] + own[: length - shared]))
        else:
            prompts.append(tokenizer.cut(common, shared) + tokenizer.cut(own, length - shared))
    return prompts, out_lengths


class _Tokenizer:
    """The model's own tokenizer if it loads from local files, else nothing (and why)."""

    def __init__(self, model: Any) -> None:
        self._tok: Any = None
        self._loaded = False
        self._why_not = "no model given"
        self._path = None
        if model is not None:
            self._path = model.tokenizer or model.path

    def _load(self) -> Any:
        if self._loaded:
            return self._tok
        self._loaded = True
        path = self._path
        if path is None:
            return None
        if not Path(path).is_dir():
            self._why_not = f"{path} is not a local model folder"
            return None
        try:
            from transformers import AutoTokenizer

            self._tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any failure means "count words instead"
            self._why_not = f"{type(exc).__name__}: {str(exc)[:160]}"
        return self._tok

    @property
    def available(self) -> bool:
        return self._load() is not None

    @property
    def why_not(self) -> str:
        self._load()
        return self._why_not

    @property
    def name(self) -> str:
        return Path(str(self._path)).name

    def cut(self, words: Sequence[str], tokens: int) -> str:
        """The first ``tokens`` tokens of the words' text, as text."""
        if tokens <= 0:
            return ""
        tok = self._load()
        ids = tok.encode(" " + " ".join(words), add_special_tokens=False, verbose=False)[:tokens]
        return tok.decode(ids)

    def render_chat(self, messages: list[dict[str, str]]) -> tuple[str, str]:
        """(prompt text, how it was rendered)."""
        tok = self._load()
        if tok is not None and getattr(tok, "chat_template", None):
            try:
                text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                return text, f"chat template of {self.name}"
            except Exception:  # noqa: BLE001, S110 - a broken template: plain rendering below
                pass
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return text, "plain 'role: content' lines (the model has no chat template)"


# --- identity: the hash and its check on resume ----------------------------------------------


def workload_hash(workload: Any) -> str:
    """SHA-256 of what a workload measures: every request (prompt, output length), the request
    body's sampling fields and every WorkloadSpec field not in :data:`NOT_HASHED`."""
    fields = {
        f.name: getattr(workload, f.name)
        for f in dataclasses.fields(workload)
        if f.name not in NOT_HASHED and f.name not in ("prompts", "output_tokens")
    }
    lengths = list(workload.output_tokens) or [workload.max_tokens] * len(workload.prompts)
    body = {
        "requests": [[p, n] for p, n in zip(workload.prompts, lengths, strict=True)],
        "sampling": SAMPLING,
        "fields": fields,
    }
    text = json.dumps(body, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def describe(workload: Any) -> dict[str, Any]:
    """What the study stores about its workload (user attribute :data:`autotune.names.WORKLOAD`)."""
    return {
        "hash": workload_hash(workload),
        "source": getattr(workload, "source", "inline"),
        "length_unit": getattr(workload, "length_unit", None),
        "chat_format": getattr(workload, "chat_format", None),
        "requests": len(workload.prompts),
    }


def check_workload(study: Any, spec: Any, *, allow_change: bool = False) -> str | None:
    """Store the workload's hash in a new study; refuse a resumed one whose workload changed.

    Returns a notice when a change was accepted (``allow_change``), else None. Raises
    :class:`SpecError` naming the spec file and ``workload`` when it changed and was not allowed.
    """
    current = describe(spec.workload)
    stored = study.user_attrs.get(names.WORKLOAD)
    if stored is None:
        study.set_user_attr(names.WORKLOAD, current)
        return None
    if stored.get("hash") == current["hash"]:
        return None
    refuse_changed_workload(study, spec, allow_change=allow_change)
    trials = len(study.get_trials(deepcopy=False))
    changes = list(study.user_attrs.get(names.WORKLOAD_CHANGES) or [])
    changes.append({"from": stored, "to": current, "after_trials": trials})
    study.set_user_attr(names.WORKLOAD_CHANGES, changes)
    study.set_user_attr(names.WORKLOAD, current)
    return (
        f"workload changed after {trials} trials (--allow-workload-change): "
        f"{str(stored.get('hash'))[:12]} -> {current['hash'][:12]}; earlier trials were "
        "measured with the old one"
    )


def refuse_changed_workload(study: Any, spec: Any, *, allow_change: bool) -> None:
    """Raise :class:`SpecError` (naming the spec file and ``workload``) when the study was
    measured with another workload and the change is not allowed; writes nothing, so a
    resume can be refused before anything is recorded in the study."""
    stored = study.user_attrs.get(names.WORKLOAD)
    if stored is None or allow_change:
        return
    current = describe(spec.workload)
    if stored.get("hash") == current["hash"]:
        return
    raise SpecError(
        f"study {study.study_name!r} was measured with another workload "
        f"(hash {str(stored.get('hash'))[:12]}, {stored.get('source')}; now "
        f"{current['hash'][:12]}, {current['source']}): its trials would not be "
        "comparable. Restore the workload, give a new --study name, or pass "
        "--allow-workload-change",
        file=str(spec.path),
        key="workload",
    )
