"""The rows `UnifiedTrainer.train_all_layers` trains on: a user's DataLoader read once into
token rows (the Trainer batches them by train.batch_size, and evaluates on the last
data.val_fraction of them), with the vocabulary and special ids the rack needs.

Vocabulary: with a tokenizer, its size and its special ids. Without one, the ids of the data
are the tokens: model.vocab_size, when set, is the rack's whole vocabulary and its top ids
serve as padding (and, for masked objectives, the mask token), so the data's ids must stay
below them; unset, the vocabulary is the data's largest id + 1 with those ids added after it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import Dataset

from stackwise.data.blocks import PreparedData, specials_of
from stackwise.errors import StackWiseError
from stackwise.objectives.base import IGNORE, Specials

KEYS = ("input_ids", "attention_mask", "labels")


class Rows(Dataset):
    """Rows of (N, L) tensors as {'input_ids': ..., 'attention_mask'?, 'labels'?}."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return int(self.tensors["input_ids"].shape[0])

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.tensors.items()}


@dataclass
class LoaderData(PreparedData):
    """PreparedData of rows read from a DataLoader; `given_specials` stands in for a
    tokenizer's special ids when there is none."""

    given_specials: Specials | None = None

    @property
    def specials(self) -> Specials:
        if self.given_specials is not None:
            return self.given_specials
        return specials_of(self.tokenizer)


def _batch_dict(batch: Any) -> dict[str, torch.Tensor]:
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise StackWiseError(
                f"The dataloader's batches are dicts without 'input_ids' (they hold "
                f"{sorted(batch)}); train_all_layers reads token ids: yield "
                "{'input_ids': (B, L) ids, 'attention_mask'?: ..., 'labels'?: ...} or id tensors."
            )
        return {k: torch.as_tensor(batch[k]) for k in KEYS if k in batch}
    if isinstance(batch, Sequence) and not isinstance(batch, str) and batch:
        return _batch_dict(batch[0])  # (ids, ...) tuples, as a TensorDataset yields
    ids = torch.as_tensor(batch)
    if ids.dim() == 1:
        ids = ids[None]
    if ids.dim() != 2 or ids.is_floating_point():
        raise StackWiseError(
            f"A dataloader batch of shape {tuple(ids.shape)} ({ids.dtype}) is not token ids; "
            "train_all_layers takes (batch, length) integer ids, or dicts holding 'input_ids'."
        )
    return {"input_ids": ids}


def read_rows(dataloader: Iterable[Any], limit: int | None = None) -> dict[str, torch.Tensor]:
    """Every batch of `dataloader` (at most `limit` rows), padded on the right to one length
    (an attention_mask marks the real tokens where lengths differ)."""
    parts: list[dict[str, torch.Tensor]] = []
    count = 0
    for batch in dataloader:
        parts.append(_batch_dict(batch))
        count += parts[-1]["input_ids"].shape[0]
        if limit is not None and count >= limit:
            break
    if not parts:
        raise StackWiseError("The dataloader yielded no batches: there is nothing to train on.")
    length = max(p["input_ids"].shape[1] for p in parts)
    ragged = any(p["input_ids"].shape[1] != length for p in parts)
    out: dict[str, list[torch.Tensor]] = {}
    for p in parts:
        if ragged and "attention_mask" not in p:
            p["attention_mask"] = torch.ones_like(p["input_ids"])
        for key, value in p.items():
            fill = IGNORE if key == "labels" else 0
            pad = length - value.shape[1]
            out.setdefault(key, []).append(
                torch.nn.functional.pad(value.long(), (0, pad), value=fill)
            )
    missing = [k for k, v in out.items() if len(v) != len(parts)]
    if missing:
        raise StackWiseError(
            f"Some dataloader batches lack {missing}; give every batch the same keys."
        )
    rows = {k: torch.cat(v)[:limit] for k, v in out.items()}
    return rows


def vocabulary(
    rows: dict[str, torch.Tensor], declared: int | None, masked: bool, tokenizer: Any
) -> tuple[int, Specials]:
    """(the rack's vocabulary size, its special ids) for these rows (see the module doc)."""
    top = int(rows["input_ids"].max())
    if tokenizer is not None:
        specials = specials_of(tokenizer)
        if masked and specials.mask_id is None:
            raise StackWiseError(
                "A masked objective (diffusion, mlm) replaces tokens by the tokenizer's mask "
                "token, and this tokenizer has none; add one (tokenizer.add_special_tokens("
                "{'mask_token': '<mask>'})) or train without a tokenizer on the ids alone."
            )
        size = max(len(tokenizer), declared or 0)
    else:
        extra = 2 if masked else 1
        size = declared if declared is not None else top + 1 + extra
        pad = size - 1
        specials = Specials(size, pad_id=pad, mask_id=pad - 1 if masked else pad)
        if top >= size - extra:
            raise StackWiseError(
                f"model.vocab_size={declared} leaves ids {size - extra}..{size - 1} for padding"
                f"{' and the mask token' if masked else ''}, but the data holds id {top}. Raise "
                "model.vocab_size, or unset it to take the data's largest id."
            )
    if top >= size:
        raise StackWiseError(
            f"The data holds token id {top}, beyond the vocabulary of {size}; raise "
            "model.vocab_size or give the tokenizer the ids came from."
        )
    return size, specials


def loader_data(
    rows: dict[str, torch.Tensor], val_fraction: float, tokenizer: Any, specials: Specials
) -> LoaderData:
    """Training rows and the held-out last `val_fraction` of them (at least one row)."""
    n = int(rows["input_ids"].shape[0])
    if n < 2:
        raise StackWiseError(
            f"The dataloader gave {n} row; train_all_layers needs at least two (one to train "
            "on, one to evaluate)."
        )
    n_val = min(n - 1, max(1, round(n * val_fraction)))
    train = Rows({k: v[: n - n_val] for k, v in rows.items()})
    val = Rows({k: v[n - n_val :] for k, v in rows.items()})
    tokens = int(rows["input_ids"].numel())
    return LoaderData(
        tokenizer=tokenizer,
        train=train,  # type: ignore[arg-type]
        val=val,  # type: ignore[arg-type]
        n_documents=n,
        n_tokens=tokens,
        describe=f"{n - n_val:,} train / {n_val:,} val rows from the dataloader",
        given_specials=None if tokenizer is not None else specials,
    )
