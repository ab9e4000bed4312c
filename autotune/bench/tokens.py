"""Counting the output tokens autotune reports, and cross-checking the server's own counts.

A figure in tokens per second is only as good as its count of tokens, so autotune counts them
itself and never takes a server's word or a stream's events for it:

* **by token ids** where the stream carries them (vLLM's ``token_ids``): one id, one token;
* else **by the model's tokenizer** on the streamed text (:class:`TokenCounter`, from the model
  folder's ``tokenizer.json`` through ``tokenizers``, else ``transformers``; a GGUF file's
  embedded vocabulary through ``transformers``' GGUF loader where it is importable). A token
  whose text is split over two events counts once, in the event that completes it; an event of
  four tokens counts four;
* only where no tokenizer can be had, the server's ``usage.completion_tokens``, and failing that
  the number of events: both recorded as suspect figures (:func:`cross_check`), never silently.

The server's ``usage`` and the engine's ``/metrics`` generation-token counter
(``server/metrics.py``, a delta per benchmark phase) are cross-checks: a disagreement with
autotune's count over :data:`SUSPECT_TOLERANCE` is stored on the trial as
``measurement_suspect`` (:data:`autotune.names.MEASUREMENT_SUSPECT`) with the three counts
and which disagree.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: a relative disagreement between two counts above this makes the measurement suspect
SUSPECT_TOLERANCE = 0.02

#: how a response's tokens were counted (RequestRecord.count_source)
BY_IDS = "ids"
BY_TOKENIZER = "tokenizer"
BY_USAGE = "usage"  # no ids, no tokenizer: the server's word (suspect)
BY_EVENTS = "events"  # no ids, no tokenizer, no usage: one event, one token (suspect)
#: sources that are autotune's own count
OWN_COUNTS = (BY_IDS, BY_TOKENIZER)

#: the generation-token counter's name in ``server_metrics`` phase records (MetricsMap)
METRICS_COUNTER = "generation_tokens"

Encode = Callable[[str], Sequence[tuple[int, int]]]


class TokenCounter:
    """Counts a text's tokens with one tokenizer; ``unavailable`` says why there is none."""

    def __init__(
        self, encode: Encode | None, source: str = "", unavailable: str | None = None
    ) -> None:
        self._encode = encode
        self.source = source
        self.unavailable = None if encode is not None else (unavailable or "no tokenizer")

    @property
    def available(self) -> bool:
        return self._encode is not None

    def count(self, text: str) -> int:
        return sum(self.per_chunk([text]))

    def per_chunk(self, pieces: Sequence[str]) -> list[int]:
        """Tokens completed in each piece of a streamed text (they sum to the text's count)."""
        if self._encode is None:
            raise RuntimeError(f"no tokenizer: {self.unavailable}")
        ends, total = [], 0
        for piece in pieces:
            total += len(piece)
            ends.append(total)
        counts = [0] * len(pieces)
        if not pieces:
            return counts
        for start, end in self._encode("".join(pieces)):
            if end <= start:
                continue  # a special token with no text
            counts[min(bisect.bisect_left(ends, end), len(pieces) - 1)] += 1
        return counts

    def describe(self) -> dict[str, Any]:
        if self._encode is None:
            return {"available": False, "reason": self.unavailable}
        return {"available": True, "source": self.source}

    @classmethod
    def for_model(cls, path: str | None, tokenizer: str | None = None) -> TokenCounter:
        """The tokenizer of a spec's model: ``model.tokenizer`` first, then ``model.path``, each
        a local folder (``tokenizer.json``, or whatever ``transformers`` reads there), a
        ``tokenizer.json`` file, or a ``.gguf`` file. Never raises: a counter without a
        tokenizer says why (``unavailable``)."""
        reasons = []
        for candidate in (tokenizer, path):
            if not candidate:
                continue
            found = _load(Path(candidate).expanduser())
            if isinstance(found, TokenCounter):
                return found
            reasons.append(f"{candidate}: {found}")
        reason = "; ".join(reasons) or "the spec names no local model folder or tokenizer"
        return cls(None, unavailable=reason)


#: a counter without a tokenizer (ids or the server's word only)
NO_TOKENIZER = TokenCounter(None, unavailable="no tokenizer given")


def _load(path: Path) -> TokenCounter | str:
    """A counter from ``path``, or why not."""
    try:
        if path.is_dir() and (path / "tokenizer.json").is_file():
            return _from_tokenizer_json(path / "tokenizer.json")
        if path.is_file() and path.name.endswith(".json"):
            return _from_tokenizer_json(path)
        if path.is_file() and path.suffix == ".gguf":
            return _from_transformers(path.parent, gguf_file=path.name)
        if path.is_dir():
            return _from_transformers(path)
    except Exception as exc:  # a broken tokenizer file must not stop a study
        return f"tokenizer not loaded ({type(exc).__name__}: {str(exc)[:200]})"
    return "not a local model folder, tokenizer.json or GGUF file"


def _from_tokenizer_json(file: Path) -> TokenCounter | str:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return _from_transformers(file.parent)
    tok = Tokenizer.from_file(str(file))

    def encode(text: str) -> Sequence[tuple[int, int]]:
        return tok.encode(text, add_special_tokens=False).offsets

    return TokenCounter(encode, source=str(file))


def _from_transformers(folder: Path, gguf_file: str | None = None) -> TokenCounter | str:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return "neither tokenizers nor transformers can read it here"
    extra = {"gguf_file": gguf_file} if gguf_file else {}
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, **extra)
    if not getattr(tok, "is_fast", False):
        return "only a slow tokenizer (no character offsets) could be loaded"

    def encode(text: str) -> Sequence[tuple[int, int]]:
        got = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        return [tuple(o) for o in got["offset_mapping"]]

    return TokenCounter(encode, source=str(folder / gguf_file) if gguf_file else str(folder))


def _off(count: float | None, reference: float) -> bool:
    if count is None:
        return False
    if reference <= 0:
        return count > 0
    return abs(count - reference) / reference > SUSPECT_TOLERANCE


def cross_check(
    counts: Mapping[str, Any], server_metrics: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The ``measurement_suspect`` record of one benchmark, or None when nothing is suspect.

    ``counts`` is ``BenchResult.counts``: autotune's and the server's ``usage`` totals per phase
    (phases with a failed request left out) and how responses were counted. ``server_metrics``
    is the trial's ``server_metrics`` record; its per-phase generation-token deltas are compared
    over the phases both have."""
    phases: Mapping[str, Mapping[str, Any]] = counts.get("phases") or {}
    own = sum(p["autotune"] for p in phases.values())
    usage_phases = [p for p in phases.values() if p.get("usage") is not None]
    usage = sum(p["usage"] for p in usage_phases) if usage_phases else None
    usage_own = sum(p["autotune"] for p in usage_phases)
    metric_total, metric_own = None, 0
    recorded = (server_metrics or {}).get("phases") or {}
    if (server_metrics or {}).get("available"):
        for name, p in phases.items():
            delta = (recorded.get(name) or {}).get(METRICS_COUNTER)
            if isinstance(delta, int | float):
                metric_total = (metric_total or 0) + delta
                metric_own += p["autotune"]
    disagree = []
    if usage is not None and _off(usage, usage_own):
        disagree.append("usage")
    text = counts.get("retokenized")
    if text and _off(text["text"], text["ids"]):
        disagree.append("text")
    if metric_total is not None and _off(metric_total, metric_own):
        disagree.append("metrics")
    counted_by = dict(counts.get("counted_by") or {})
    not_own = {k: v for k, v in counted_by.items() if k not in OWN_COUNTS}
    if not disagree and not not_own:
        return None
    record: dict[str, Any] = {
        "autotune": own,
        "usage": usage,
        "metrics": None if metric_total is None else round(metric_total, 4),
        "disagree": disagree,
        "counted_by": counted_by,
        "tolerance": SUSPECT_TOLERANCE,
    }
    if "text" in disagree:
        record["retokenized"] = dict(text)
    if metric_total is not None and metric_own != own:
        record["autotune_in_metrics_phases"] = metric_own
    if not_own:
        record["no_tokenizer"] = (counts.get("tokenizer") or {}).get("reason") or "no tokenizer"
    return record


def suspect_line(record: Mapping[str, Any]) -> str:
    """One line for ``show``, the report and the export header."""
    parts = [f"autotune counted {record.get('autotune')}"]
    if record.get("usage") is not None:
        parts.append(f"the server's usage {record['usage']}")
    if record.get("metrics") is not None:
        parts.append(f"its /metrics {record['metrics']:g}")
    line = "measurement suspect: " + ", ".join(parts) + " output tokens"
    if record.get("disagree"):
        line += f" ({' and '.join(record['disagree'])} off by over {SUSPECT_TOLERANCE:.0%})"
    if record.get("retokenized"):
        ids, text = record["retokenized"]["ids"], record["retokenized"]["text"]
        line += f"; the answers carried {ids} token ids for {text} tokens of text"
    if record.get("no_tokenizer"):
        line += f"; no tokenizer, so the count is the server's word ({record['no_tokenizer']})"
    return line


def not_own_counts(counts: Mapping[str, Any]) -> dict[str, int]:
    """How many answers of a benchmark (``BenchResult.counts``) were counted otherwise than by
    autotune itself (the server's usage, or events), by how; empty when every one was."""
    counted_by = counts.get("counted_by") or {}
    return {how: n for how, n in counted_by.items() if how not in OWN_COUNTS}


def uncountable_detail(why_no_tokenizer: str | None) -> str:
    """Why autotune cannot count a server's tokens, and what the user gives it to count them."""
    why = " ".join((why_no_tokenizer or "none found").split())  # one line, whatever it says
    return (
        "the server's answers carry no token ids and no tokenizer could be loaded "
        f"({why}); speeds would be the server's own word. Give model.tokenizer (a "
        "tokenizer.json, a folder with one, or a GGUF file) in the spec"
    )


def length_problem(source: str, counted: int, asked: int, finish: str | None) -> str | None:
    """Why an answer is not one of the workload's, or None. Every benchmark request asks for
    exactly ``asked`` tokens (``max_tokens``, the end-of-sequence token ignored), and an answer
    that ends at the length limit (``finish_reason: length``) with fewer ids than that is
    shorter than the workload: a server that says so falsely (its figures would be a shorter
    workload's, end-to-end times halved) or a context too small for the answer. Judged by ids
    alone, the one exact count (a tokenizer's count of the text may differ by a token)."""
    if source == BY_IDS and finish == "length" and counted < asked:
        return (
            f'the answer ended at the length limit (finish_reason "length") after {counted} of '
            f"the {asked} tokens asked: not the workload's answer (a context too small for "
            "it, or a server that stops early)"
        )
    return None


def retokenized(records: Sequence[Any], counter: TokenCounter) -> dict[str, int] | None:
    """The token ids of the completed answers counted by ids, against the tokenizer's count of
    their streamed text (None: no tokenizer, or no answer counted by ids). An honest server's
    ids are its text's tokens (SmolLM2 on llama.cpp: 768 of 768 over 12 answers, multi-byte
    text included); a server that sends two ids a token doubled every figure unseen. Counted
    after the benchmark, never on its hot path."""
    by_ids = [r for r in records if r.ok and r.count_source == BY_IDS]
    if not by_ids or not counter.available:
        return None
    return {
        "ids": sum(len(r.token_ids) for r in by_ids),
        "text": sum(counter.count(r.text) for r in by_ids),
    }


def off_length(records: Sequence[Any]) -> dict[str, int]:
    """How many completed answers (``RequestRecord``s) were not of the length asked, empty when
    all were: ``shorter_than_asked`` (by ids, exact; by a tokenizer, more than 10 % short: a
    server that ends its answers early measures a shorter workload) and
    ``longer_than_asked`` with the ``uncounted_tokens`` they streamed beyond it (never counted:
    nobody asked for them)."""
    done = [r for r in records if r.ok and r.asked_tokens]
    shorter = sum(
        1
        for r in done
        if (r.count_source == BY_IDS and r.output_tokens < r.asked_tokens)
        or (r.count_source == BY_TOKENIZER and r.output_tokens < 0.9 * r.asked_tokens)
    )
    beyond = [r.uncounted_tokens for r in done if r.uncounted_tokens]
    out = {"shorter_than_asked": shorter} if shorter else {}
    if beyond:
        out.update(longer_than_asked=len(beyond), uncounted_tokens=sum(beyond))
    return out


def off_length_line(lengths: Mapping[str, int], answers: int) -> str:
    """One line for a benchmark whose answers were not all of the length asked."""
    parts = []
    if lengths.get("shorter_than_asked"):
        parts.append(
            f"{lengths['shorter_than_asked']} of {answers} answers were shorter than the "
            "max_tokens asked (the figures are a shorter workload's)"
        )
    if lengths.get("longer_than_asked"):
        parts.append(
            f"{lengths['longer_than_asked']} streamed {lengths['uncounted_tokens']} tokens "
            "beyond max_tokens, not counted"
        )
    return "answer length: " + "; ".join(parts)


def usage_tokens(usage: dict[str, Any]) -> int | None:
    """``usage.completion_tokens``, the server's own count of the answer's tokens (a
    cross-check, never the count), if given; TypeError when it is not an integer."""
    count = usage.get("completion_tokens")
    if count is not None and count.__class__ is not int:
        raise TypeError("usage.completion_tokens is not an integer")
    return count
