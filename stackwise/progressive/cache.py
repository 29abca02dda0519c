"""The activation cache: a frozen trunk's boundary hidden states, keyed by sample and variant.

A key is an integer `sample * variants + variant`, where the variant picks the time step or mask
seed; the objective rebuilds the same corrupted input from the key, so only hidden states are
stored, never masks. Entries live in fixed-size slots of one tensor, in RAM or in a memmap on
disk (bf16/fp16 bits as uint16), so both storages behave identically. When a byte budget leaves
fewer slots than keys, the least recently used entry is evicted, or an error is raised.

`mode="stack"` keeps one boundary (the input of the stack being trained); `mode="rack"` keeps
every boundary, so each earlier stack's input stays available too.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from stackwise.errors import StackWiseError
from stackwise.precision import torch_dtype


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    evictions: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions}


class BoundaryStore:
    """Slots of (seq_len, d_model) hidden states for one stack boundary."""

    def __init__(
        self,
        capacity: int,
        shape: tuple[int, int],
        dtype: torch.dtype,
        path: Path | None,
    ) -> None:
        self.capacity, self.shape, self.dtype, self.path = capacity, shape, dtype, path
        if path is None:
            self.data = torch.empty((capacity, *shape), dtype=dtype)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            mm = np.memmap(path, dtype=np.uint16, mode="w+", shape=(capacity, *shape))
            self.data = torch.from_numpy(mm).view(dtype)
        self.slot_of: OrderedDict[int, int] = OrderedDict()  # key -> slot, oldest use first
        self.free = list(range(capacity - 1, -1, -1))

    @property
    def nbytes(self) -> int:
        return len(self.slot_of) * self.entry_bytes

    @property
    def entry_bytes(self) -> int:
        return self.shape[0] * self.shape[1] * self.dtype.itemsize

    def close(self) -> None:
        self.slot_of.clear()
        self.data = torch.empty(0)
        if self.path is not None and self.path.exists():
            self.path.unlink()


class ActivationCache:
    def __init__(
        self,
        n_keys: int,
        seq_len: int,
        d_model: int,
        dtype: str = "bf16",
        storage: str = "memory",
        folder: str | Path | None = None,
        max_bytes: int | None = None,
        on_full: str = "evict",
        mode: str = "stack",
        boundaries: int = 1,
    ) -> None:
        """`boundaries`: how many stores mode 'rack' may hold; max_bytes is shared by all."""
        if storage == "disk" and folder is None:
            raise ValueError("disk storage needs a folder")
        self.n_keys, self.shape = n_keys, (seq_len, d_model)
        self.dtype = torch_dtype(dtype)
        self.storage, self.folder = storage, Path(folder) if folder is not None else None
        self.max_bytes, self.on_full, self.mode = max_bytes, on_full, mode
        entry = seq_len * d_model * self.dtype.itemsize
        shares = max(1, boundaries) if mode == "rack" else 1
        self.capacity = n_keys if max_bytes is None else min(n_keys, max_bytes // entry // shares)
        if self.capacity < 1:
            raise StackWiseError(
                f"progressive.cache.max_bytes={max_bytes} is smaller than one cached sample "
                f"({entry} bytes = seq_len {seq_len} x d_model {d_model} x "
                f"{self.dtype.itemsize}); raise it or disable the cache."
            )
        self.stores: dict[int, BoundaryStore] = {}  # boundary (number of trunk stacks) -> store
        self.stats = CacheStats()
        self.trunk_calls = 0  # trunk forwards run on misses, for tests and reports

    # -- boundaries ---------------------------------------------------------------------------

    def _store(self, boundary: int) -> BoundaryStore:
        if boundary not in self.stores:
            path = None
            if self.storage == "disk":
                assert self.folder is not None
                path = self.folder / f"boundary_{boundary}.u16"
            self.stores[boundary] = BoundaryStore(self.capacity, self.shape, self.dtype, path)
        return self.stores[boundary]

    def drop_except(self, boundary: int) -> None:
        """Release every boundary but one (mode 'stack' once the next boundary is built)."""
        for old in [b for b in self.stores if b != boundary]:
            self.stores.pop(old).close()

    def deepest(self, key: int, below: int) -> int | None:
        """The deepest boundary under `below` that holds `key` (mode 'rack' keeps several)."""
        for b in sorted((b for b in self.stores if b < below), reverse=True):
            if key in self.stores[b].slot_of:
                return b
        return None

    def entries(self, boundary: int) -> list[int]:
        store = self.stores.get(boundary)
        return list(store.slot_of) if store else []

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.stores.values())

    def bytes_per_token(self) -> float:
        return self.dtype.itemsize * self.shape[1]

    # -- reads and writes ---------------------------------------------------------------------

    def lookup(self, boundary: int, keys: list[int]) -> tuple[list[int], list[int]]:
        """(positions of hits, positions of misses) within `keys`; hits become most recent."""
        store = self.stores.get(boundary)
        hits, misses = [], []
        for i, k in enumerate(keys):
            if store is not None and k in store.slot_of:
                store.slot_of.move_to_end(k)
                hits.append(i)
            else:
                misses.append(i)
        self.stats.hits += len(hits)
        self.stats.misses += len(misses)
        return hits, misses

    def read(self, boundary: int, keys: list[int]) -> torch.Tensor:
        store = self.stores[boundary]
        slots = torch.tensor([store.slot_of[k] for k in keys], dtype=torch.long)
        return store.data.index_select(0, slots)

    def write(self, boundary: int, keys: list[int], hidden: torch.Tensor) -> None:
        store = self._store(boundary)
        values = hidden.detach().to("cpu", self.dtype)
        for k, row in zip(keys, values, strict=True):
            slot = store.slot_of.get(k)
            if slot is None:
                if not store.free:
                    if self.on_full == "error":
                        raise StackWiseError(
                            f"The activation cache is full: {store.capacity} samples "
                            f"({store.capacity * store.entry_bytes:,} bytes) fit in "
                            f"progressive.cache.max_bytes={self.max_bytes}. Raise max_bytes, "
                            "set on_full: evict, or use fewer samples or variants."
                        )
                    _, freed = store.slot_of.popitem(last=False)
                    store.free.append(freed)
                    self.stats.evictions += 1
                slot = store.free.pop()
                store.slot_of[k] = slot
            else:
                store.slot_of.move_to_end(k)
            store.data[slot] = row

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.stores.clear()
        if self.folder is not None:  # remove the (now empty) rank folder and its parent
            for d in (self.folder, self.folder.parent):
                with contextlib.suppress(OSError):
                    d.rmdir()
