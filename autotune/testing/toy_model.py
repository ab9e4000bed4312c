"""A deterministic toy language model for the fake server (a test double, not a real model).

Why: autotune's correctness gate compares a candidate's greedy tokens and logprobs with a pinned
reference. To test that gate (and the fault modes that must trip it) the fake server needs a
"model" whose right answer is obvious and whose logprobs are exactly reproducible. This one:

* Tokenizer: word level. A token is a word from a fixed vocabulary, with or without one leading
  space (``"one"`` and ``" one"`` are different tokens), or a single ``" "`` / ``"\\n"``.
  Anything else becomes ``<unk>``. ``</s>`` (id 0) is the end-of-sequence token.
* Vocabulary: number words ``zero .. twenty``, numerals ``0 .. 999`` and letters ``a .. z``.
* Greedy continuation: the successor in the sequence of the last word, so ``"one two three"``
  continues ``" four five six"``, ``"17 18 19"`` continues ``" 20 21 22"`` and ``"d e f"``
  continues ``" g h i"``. The end of a sequence (``twenty``, ``999``, ``z``) is followed by
  ``</s>``; after ``</s>`` or an unknown word the model counts from ``" 0"``.
* Logprobs: a fixed ranked table (top-1 about -0.08, top-2 -3.2, ...) minus a tiny deterministic
  per-position variation, so logprobs differ between positions but never between runs. Every
  vocabulary token has a defined logprob and rank, so teacher-forced prompt scoring works.

Two switches model candidate faults: ``broken`` puts whitespace at rank 1 (the "CUDA graphs return
spaces" failure) and ``drift`` moves logprobs by up to +-0.02 without changing any ranking (what
``--kv-cache-dtype fp8`` did on a real trained model), so tolerance policies can be tested.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

EOS_ID = 0
UNK_ID = 1
SPACE_ID = 2
NEWLINE_ID = 3

NUMBER_WORDS: tuple[str, ...] = (
    "zero",
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
)
NUMERALS: tuple[str, ...] = tuple(str(i) for i in range(1000))
LETTERS: tuple[str, ...] = tuple("abcdefghijklmnopqrstuvwxyz")
SEQUENCES: tuple[tuple[str, ...], ...] = (NUMBER_WORDS, NUMERALS, LETTERS)

# Ranked logprobs of the explicit top entries of every distribution. exp() of these sums to about
# 0.98; the rest of the vocabulary shares the remainder at about -12, so it is a real distribution.
_TOP_LOGPROBS: tuple[float, ...] = (-0.08, -3.2, -4.5, -5.3, -6.0, -6.6, -7.1, -7.5)
_TAIL_LOGPROB = -12.0
_TOKEN_RE = re.compile(r" ?[^\s]+|\s")


@dataclass(frozen=True)
class TokenScore:
    """One token's place in a next-token distribution (vLLM's ``Logprob``: logprob and rank)."""

    token_id: int
    logprob: float
    rank: int


@dataclass
class Vocab:
    """The fixed vocabulary: id <-> string, plus each word's successor."""

    strings: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    successor: dict[str, str | None] = field(default_factory=dict)

    @classmethod
    def build(cls) -> Vocab:
        """Build the vocabulary; ids are stable because the word lists are fixed."""
        vocab = cls()
        for special in ("</s>", "<unk>", " ", "\n"):
            vocab._add(special)
        for seq in SEQUENCES:
            for i, word in enumerate(seq):
                vocab._add(word)
                vocab._add(" " + word)
                vocab.successor[word] = seq[i + 1] if i + 1 < len(seq) else None
        return vocab

    def _add(self, s: str) -> None:
        self.ids[s] = len(self.strings)
        self.strings.append(s)

    def __len__(self) -> int:
        return len(self.strings)


class ToyModel:
    """The deterministic toy model. Pure functions of the token context; safe to share."""

    def __init__(self) -> None:
        self.vocab = Vocab.build()

    # -- tokenizer -------------------------------------------------------------------------
    def tokenize(self, text: str) -> list[int]:
        """Split ``text`` into word tokens (with their leading space) and whitespace tokens."""
        return [self.vocab.ids.get(piece, UNK_ID) for piece in _TOKEN_RE.findall(text)]

    def tokenizer_json(self) -> str:
        """This tokenizer as a ``tokenizers`` ``tokenizer.json`` (word level, split as
        :meth:`tokenize` splits), for the test double's model folder: autotune counts a
        text-only stream of the fake server with it, as it does a real model's."""
        from tokenizers import Regex, Tokenizer, models, pre_tokenizers

        tok = Tokenizer(models.WordLevel(vocab=dict(self.vocab.ids), unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.Split(Regex(_TOKEN_RE.pattern), behavior="isolated")
        return tok.to_str()

    def token_str(self, token_id: int) -> str:
        """The token's string as logprobs report it (``</s>`` included)."""
        return self.vocab.strings[token_id]

    def decode(self, token_ids: Sequence[int]) -> str:
        """Text of ``token_ids`` with special tokens skipped (vLLM's skip_special_tokens)."""
        return "".join(self.vocab.strings[t] for t in token_ids if t not in (EOS_ID, UNK_ID))

    def valid_id(self, token_id: int) -> bool:
        """Whether ``token_id`` is in the vocabulary."""
        return 0 <= token_id < len(self.vocab)

    # -- model -----------------------------------------------------------------------------
    def true_next(self, context: Sequence[int]) -> int:
        """The correct greedy next token: the successor of the last word in ``context``."""
        trailing_space = False
        for token_id in reversed(context):
            if token_id in (SPACE_ID, NEWLINE_ID):
                trailing_space = True
                continue
            word = self.vocab.strings[token_id].lstrip(" ")
            if token_id in (EOS_ID, UNK_ID) or word not in self.vocab.successor:
                break
            nxt = self.vocab.successor[word]
            if nxt is None:
                return EOS_ID
            return self.vocab.ids[nxt if trailing_space else " " + nxt]
        return self.vocab.ids["0" if trailing_space else " 0"]

    def distribution(
        self, context: Sequence[int], *, broken: bool = False, drift: bool = False
    ) -> list[TokenScore]:
        """The explicit top of the next-token distribution, best first (8 entries).

        Args:
            context: token ids so far (prompt plus generated).
            broken: model a numerically broken kernel: whitespace wins, the right token is 2nd.
            drift: model a lower-precision KV cache: logprobs move by up to +-0.02, ranks do not.
        """
        ranked = self._ranked_ids(context, broken)
        pos = len(context)
        variation = ((ranked[0] * 31 + pos * 17) % 11) * 0.002
        scores: list[TokenScore] = []
        for rank, (token_id, base) in enumerate(zip(ranked, _TOP_LOGPROBS, strict=True), start=1):
            lp = base - variation
            if drift:
                lp += ((token_id * 13 + pos * 7) % 21 - 10) * 0.002
            scores.append(TokenScore(token_id, round(min(lp, -1e-4), 6), rank))
        return scores

    def score(
        self, context: Sequence[int], token_id: int, *, broken: bool = False, drift: bool = False
    ) -> TokenScore:
        """Logprob and rank of ``token_id`` after ``context`` (any vocabulary token)."""
        top = self.distribution(context, broken=broken, drift=drift)
        for entry in top:
            if entry.token_id == token_id:
                return entry
        # Outside the explicit top: rank by id among the remaining tokens, a slowly falling tail.
        below = sum(1 for entry in top if entry.token_id < token_id)
        ordinal = token_id - below
        return TokenScore(
            token_id, round(_TAIL_LOGPROB - 0.001 * ordinal, 6), len(top) + 1 + ordinal
        )

    def sample(
        self,
        context: Sequence[int],
        temperature: float,
        rng: random.Random,
        *,
        broken: bool = False,
        drift: bool = False,
    ) -> TokenScore:
        """Next token: argmax when ``temperature`` is 0, else a draw from the explicit top."""
        top = self.distribution(context, broken=broken, drift=drift)
        if temperature <= 0.0:
            return top[0]
        weights = [pow(2.718281828459045, entry.logprob / temperature) for entry in top]
        return rng.choices(top, weights=weights, k=1)[0]

    def greedy(self, prompt: str, max_tokens: int) -> str:
        """Convenience for tests: the greedy completion text, stopping at ``</s>``."""
        context = self.tokenize(prompt)
        out: list[int] = []
        for _ in range(max_tokens):
            token_id = self.distribution(context)[0].token_id
            out.append(token_id)
            context.append(token_id)
            if token_id == EOS_ID:
                break
        return self.decode(out)

    def _ranked_ids(self, context: Sequence[int], broken: bool) -> list[int]:
        """Eight distinct token ids in rank order, a deterministic function of the context."""
        right = self.true_next(context)
        skip = self.true_next([*context, right]) if right != EOS_ID else SPACE_ID
        candidates = [right, skip, EOS_ID, SPACE_ID, NEWLINE_ID]
        if broken:
            candidates = [SPACE_ID, right, *candidates]
        ranked: list[int] = []
        for token_id in candidates:
            if token_id not in ranked:
                ranked.append(token_id)
        size = len(self.vocab)
        j = 1
        while len(ranked) < len(_TOP_LOGPROBS):
            filler = (right * 7 + j * 131) % size
            if filler not in ranked and filler != UNK_ID:
                ranked.append(filler)
            j += 1
        return ranked
