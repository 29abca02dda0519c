"""A decoding constraint for masked samplers: no word directly repeats the word before it.

Why: a masked sampler decides neighbouring words in parallel, each without seeing the other,
and a small model's likeliest word is the same frequent one everywhere ("the the"). Causal
decoders have `no_repeat_ngram_size` for their version of this; this is the word-level one for
character- and byte-level vocabularies, where a word is a run of letter tokens.

When both words and the separator between them are revealed and the second word equals the first
(ignoring case), the second word's positions are masked again and its first token is banned at
its first position, so the redraw cannot give the same word back.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import torch

LETTER, OTHER = 0, 1


@dataclass
class WordRepeatGuard:
    kinds: list[int]  # LETTER or OTHER per token id (ids past the end are OTHER)
    keys: list[str]  # the lower-case character of each id ("" for OTHER)
    mask_id: int
    bans: dict[tuple[int, int], set[int]] = field(default_factory=dict)

    @classmethod
    def from_pieces(cls, pieces: list[str], mask_id: int) -> WordRepeatGuard:
        """`pieces[i]` is what token i decodes to; each must be at most one character."""
        long = [p for p in pieces if len(p) > 1]
        if long:
            raise ValueError(
                "sample.no_repeat_words needs a character- or byte-level vocabulary (a word is "
                f"a run of one-letter tokens), but tokens such as {long[:3]} hold several "
                "characters; use data.tokenizer: char or byte, or turn no_repeat_words off"
            )
        kinds = [LETTER if p.isalpha() or p == "'" else OTHER for p in pieces]
        keys = [p.lower() if p.isalpha() or p == "'" else "" for p in pieces]
        return cls(kinds, keys, mask_id)

    def _words(self, ids: list[int]) -> list[tuple[int, int, bool]]:
        """(start, end, complete) of each letter run; complete when neither edge is masked
        and the gap to the previous run holds no mask."""
        n_known = len(self.kinds)
        kind = [self.kinds[i] if 0 <= i < n_known else OTHER for i in ids]
        masked = [i == self.mask_id for i in ids]
        out: list[tuple[int, int, bool]] = []
        i, n = 0, len(kind)
        while i < n:
            if masked[i] or kind[i] != LETTER:
                i += 1
                continue
            j = i
            while j < n and not masked[j] and kind[j] == LETTER:
                j += 1
            edges_known = (i == 0 or not masked[i - 1]) and (j == n or not masked[j])
            out.append((i, j, edges_known))
            i = j
        return out

    def repeats(self, x: torch.Tensor, start: int) -> list[tuple[int, int, int]]:
        """(row, begin, end) of each generated word that repeats the word just before it."""
        found = []
        for r, row in enumerate(x.tolist()):  # one transfer, plain ints: x may be on a GPU
            words = self._words(row)
            for (a0, b0, ok0), (a1, b1, ok1) in itertools.pairwise(words):
                if not (ok0 and ok1) or b1 <= start or self.mask_id in row[b0:a1]:
                    continue
                if b0 - a0 == b1 - a1 and all(
                    self.keys[p] == self.keys[q]
                    for p, q in zip(row[a0:b0], row[a1:b1], strict=True)
                ):
                    found.append((r, max(a1, start), b1))
        return found

    def mend(
        self, x: torch.Tensor, start: int, in_block: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Mask each repeat again and ban its first token there. A word that ended in an earlier
        block (its end was only known once this block revealed the next character) joins the
        block being filled. Returns (x, in_block), the same tensors when there is no repeat."""
        found = self.repeats(x, start)
        if not found:
            return x, in_block
        x, in_block = x.clone(), in_block.clone()
        for r, a, b in found:
            self.bans.setdefault((r, a), set()).add(int(x[r, a]))
            x[r, a:b] = self.mask_id
            in_block[r, a:b] = True
        return x, in_block

    def apply_bans(self, logits: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """`logits` (B, n, V) of positions offset..offset + n - 1, with each ban applied."""
        if not self.bans:
            return logits
        logits = logits.clone()
        for (r, p), toks in self.bans.items():
            if 0 <= p - offset < logits.shape[1]:
                logits[r, p - offset, sorted(toks)] = float("-inf")
        return logits
