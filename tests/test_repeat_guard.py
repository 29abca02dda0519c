"""The word-repeat guard: what counts as a repeat, how a sampler redraws it, and which configs
may ask for it."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from stackwise.errors import StackWiseError
from stackwise.repeat_guard import WordRepeatGuard
from stackwise.samplers import MaskedSampler, MaskedSampling

# ids: 0 mask, 1 eos, 2 space, 3 comma, 4.. letters
PIECES = ["", "", " ", ",", "t", "h", "e", "a", "T", "n"]
MASK = 0
IDS = {c: i for i, c in enumerate(PIECES) if c}


def enc(text: str) -> torch.Tensor:
    return torch.tensor([[MASK if c == "_" else IDS[c] for c in text]])


def guard() -> WordRepeatGuard:
    return WordRepeatGuard.from_pieces(PIECES, MASK)


@pytest.mark.parametrize(
    ("text", "start", "found"),
    [
        ("the the", 0, [(0, 4, 7)]),
        ("The the,", 0, [(0, 4, 7)]),  # case is ignored
        ("the, the a", 0, [(0, 5, 8)]),  # punctuation between them is still a repeat
        ("the then", 0, []),
        ("the _he", 0, []),  # a masked letter: the word is not known yet
        ("the the_", 0, []),  # its end may still grow
        ("the_the", 0, []),  # the gap is not known yet
        ("a a a", 0, [(0, 2, 3), (0, 4, 5)]),
        ("the the", 5, [(0, 5, 7)]),  # only the generated part is reported
        ("the the a", 8, []),  # the repeat lies wholly in the prompt
    ],
)
def test_repeats_are_found_only_when_both_words_are_whole(text, start, found):
    assert guard().repeats(enc(text), start) == found


def test_mend_masks_the_second_word_and_bans_its_first_letter():
    g = guard()
    x = enc("a the the")
    in_block = torch.zeros_like(x, dtype=torch.bool)
    in_block[0, 8:] = True  # the block being filled revealed the last letter only
    out, grown = g.mend(x, 2, in_block)
    assert out[0].tolist() == enc("a the ___")[0].tolist()
    assert grown[0].tolist() == [False] * 6 + [True] * 3  # the whole word is redrawn now
    assert g.bans == {(0, 6): {IDS["t"]}}
    logits = g.apply_bans(torch.zeros(1, x.shape[1], len(PIECES)))
    assert logits[0, 6, IDS["t"]] == -math.inf and bool(logits.isfinite()[0, :6].all())
    same, block = g.mend(enc("a the then"), 2, in_block)  # nothing to mend: unchanged
    assert torch.equal(same, enc("a the then")) and block is in_block


def test_ids_past_the_tokenizer_are_separators():
    # a model vocabulary larger than the tokenizer's (model.vocab_size) may sample such ids
    assert guard().repeats(torch.tensor([[IDS["a"], 50, IDS["a"]]]), 0) == [(0, 2, 3)]


def test_multi_character_vocabularies_are_refused():
    with pytest.raises(ValueError, match="character- or byte-level"):
        WordRepeatGuard.from_pieces(["", " ", "the", "a"], 0)


class Prefers(nn.Module):
    """A 'rack' that wants 'a' at every letter slot and a space after it: without the guard,
    the sample repeats the prompt's word."""

    uses_time = False

    def forward(self, x, attention_mask=None, t=None):
        logits = torch.full((*x.shape, len(PIECES)), -20.0)
        logits[..., IDS["a"]] = 0.0
        logits[..., IDS["h"]] = -2.0  # the runner-up
        logits[:, 3, :] = -20.0
        logits[:, 3, IDS[" "]] = 5.0  # position 3 is a space, revealed first
        logits[..., MASK] = -math.inf
        return logits


@pytest.mark.parametrize("sampler", ["remask", "ancestral"])
def test_a_sampler_with_the_guard_redraws_the_repeat(sampler):
    outs = {}
    for on in (False, True):
        s = MaskedSampler(
            Prefers(),
            MaskedSampling(sampler=sampler, steps=2, temperature=0),
            MASK,
            [MASK],
            torch.Generator().manual_seed(0),
            guard=guard() if on else None,
        )
        outs[on] = s.run(enc("a "), 2)[0].tolist()
    assert outs[False] == enc("a a ")[0].tolist()
    assert outs[True] == enc("a h ")[0].tolist()  # the runner-up, after one redraw


@pytest.mark.parametrize(
    ("overrides", "match"),
    [
        ({"objective": {"name": "clm"}}, "only applies to masked"),
        ({"data": {"tokenizer": None}}, "needs a character- or byte-level vocabulary"),
    ],
)
def test_configs_where_the_guard_cannot_work_are_refused(tiny, overrides, match):
    base = {"objective": {"name": "diffusion"}, "data": {"tokenizer": "char"}}
    for key, value in overrides.items():
        base[key] = {**base.get(key, {}), **value}
    with pytest.raises(StackWiseError, match=match):
        tiny(sample={"no_repeat_words": True}, **base)


def test_guarded_samples_of_a_trained_char_rack_hold_no_repeated_word(tiny):
    from stackwise.generate import generate
    from stackwise.pipeline import train_from_config

    cfg = tiny(objective={"name": "diffusion"}, data={"tokenizer": "char"}, train={"max_steps": 2})
    res = train_from_config(cfg, quiet=True)
    got = generate(
        res.config, res.rack, res.data.tokenizer, n=4, no_repeat_words=True, block_length=8
    )
    g = repeat_guard_of(res.data.tokenizer)
    prompt_len = got.prompt_len
    assert g.repeats(got.ids, prompt_len) == []
    assert all(isinstance(t, str) for t in got.texts)


def repeat_guard_of(tokenizer) -> WordRepeatGuard:
    from stackwise.generate import repeat_guard

    return repeat_guard(tokenizer, tokenizer.mask_token_id)
