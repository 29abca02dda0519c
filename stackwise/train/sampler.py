"""The training sampler: the data position is two integers (epoch, batch), for exact resume."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, IterableDataset, Sampler

from stackwise import seeds
from stackwise.data.stream import StreamedBlocks
from stackwise.errors import StackWiseError


class EpochSampler(Sampler[int]):
    """A permutation seeded by (seed, epoch), this rank's share of it, from `start` on."""

    def __init__(
        self,
        n: int,
        seed: int,
        rank: int = 0,
        world: int = 1,
        shuffle: bool = True,
        fixed_shard: bool = False,
    ):
        self.n, self.seed, self.rank, self.world, self.shuffle = n, seed, rank, world, shuffle
        # fixed_shard: each rank always sees the same items (shuffled within), so a per-rank
        # activation cache holds 1/world of the data and keeps hitting across epochs
        self.fixed_shard = fixed_shard
        self.epoch = 0
        self.start = 0

    @classmethod
    def over(cls, data: Dataset, seed: int, rank: int, world: int) -> EpochSampler:
        """The training sampler of `data`; a dataset marked `fixed_shard` keeps its shards."""
        fixed = bool(getattr(data, "fixed_shard", False))
        return cls(len(data), seed, rank, world, fixed_shard=fixed)

    def order(self) -> list[int]:
        if self.fixed_shard:
            usable = self.n - self.n % self.world
            mine = torch.arange(self.rank, usable, self.world)
            if self.shuffle:
                g = torch.Generator().manual_seed(seeds.epoch_order(self.seed, self.epoch))
                mine = mine[torch.randperm(len(mine), generator=g)]
            return mine.tolist()
        if self.shuffle:
            g = torch.Generator().manual_seed(seeds.epoch_order(self.seed, self.epoch))
            perm = torch.randperm(self.n, generator=g).tolist()
        else:
            perm = list(range(self.n))
        usable = self.n - self.n % self.world
        return perm[self.rank : usable : self.world]

    def __iter__(self) -> Iterator[int]:
        return iter(self.order()[self.start :])

    def __len__(self) -> int:
        return self.n // self.world - self.start


def training_sampler(data: Dataset, tc: Any, rank: int, world: int) -> EpochSampler | None:
    """The epoch sampler of `data`; None for a stream (data.streaming), which has no length."""
    if isinstance(data, StreamedBlocks):
        return None
    if isinstance(data, IterableDataset):
        raise StackWiseError(
            f"The training data is an iterable dataset ({type(data).__name__}), which the "
            "Trainer cannot resume exactly or shard across processes. Give a map-style "
            "dataset (with __len__ and __getitem__), or stream a corpus with data.streaming."
        )
    if len(data) < tc.batch_size * world:
        raise StackWiseError(
            f"The training set has {len(data)} sequences, fewer than one batch of "
            f"train.batch_size={tc.batch_size} per process. Lower the batch size or add data."
        )
    return EpochSampler.over(data, tc.seed, rank, world)


IPC_TEMPDIR_MAX = 70  # an AF_UNIX path holds 107 bytes; multiprocessing adds ~35 under it


def ipc_tempdir_that_fits() -> str | None:
    """Loader workers hand tensors back over AF_UNIX sockets made in multiprocessing's temp
    dir, under TMPDIR. Under a long TMPDIR the socket path does not fit: the worker fails
    ("AF_UNIX path too long") and the trainer waits forever. So multiprocessing gets a short
    folder of its own then (CPython 3.13 does this itself); returns it, or None if not needed."""
    import multiprocessing.process
    import multiprocessing.util
    import shutil
    import tempfile

    config = multiprocessing.process.current_process()._config
    if config.get("tempdir") or len(tempfile.gettempdir()) <= IPC_TEMPDIR_MAX:
        return None
    for base in ("/tmp", "/var/tmp", "/dev/shm"):
        if os.path.isdir(base) and os.access(base, os.W_OK | os.X_OK):
            folder = tempfile.mkdtemp(prefix="pymp-", dir=base)
            multiprocessing.util.Finalize(None, shutil.rmtree, (folder, True), exitpriority=-100)
            config["tempdir"] = folder
            return folder
    return None


def _options(workers: int, seed: int, epoch: int) -> dict[str, Any]:
    if workers:
        ipc_tempdir_that_fits()
    return {
        "num_workers": workers,
        # Ctrl-C reaches the workers too; they must keep loading while the step finishes
        "worker_init_fn": _ignore_sigint if workers else None,
        # its own generator: creating an iterator draws a worker seed, which must not move
        # the global RNG (dropout), or a resumed run would diverge from an uninterrupted one
        "generator": torch.Generator().manual_seed(seeds.loader_workers(seed, epoch)),
    }


def epoch_loader(
    data: Dataset, sampler: EpochSampler, epoch: int, start: int, loading: tuple[int, int, int]
) -> DataLoader:
    """Epoch `epoch`'s batches from batch `start` on. `loading`: (batch size, workers, seed)."""
    batch_size, workers, seed = loading
    sampler.epoch, sampler.start = epoch, start * batch_size
    return DataLoader(
        data,
        batch_size=batch_size,
        sampler=sampler,
        drop_last=True,
        collate_fn=getattr(data, "collate", None),  # rows of their own lengths pad per batch
        **_options(workers, seed, epoch),
    )


def stream_loader(
    data: StreamedBlocks,
    start: Any,
    shard: tuple[int, int],
    loading: tuple[int, int, int],
    epoch: int,
) -> DataLoader:
    """A stream's batches from `start` (a checkpoint's position; None: the epoch's start) for
    rank `shard[0]` of `shard[1]`. `loading`: (batch size, workers, seed)."""
    data.start = tuple(start) if start is not None else None
    data.rank, data.world = shard
    batch_size, workers, seed = loading
    return DataLoader(data, batch_size=batch_size, drop_last=True, **_options(workers, seed, epoch))


def _ignore_sigint(worker_id: int) -> None:
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def batch_stream(
    loader: Callable[[int], DataLoader], state: Any, device: torch.device
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless batches from (state.epoch, state.batch_in_epoch) on, advancing both, so a
    checkpoint of `state` says where to continue. `loader(start)`: the current epoch's."""
    while True:
        for batch in loader(state.batch_in_epoch):
            state.batch_in_epoch += 1
            if "stream_pos" in batch:  # a streamed epoch: where it goes on after this batch
                state.stream_position = batch.pop("stream_pos")[-1].tolist()
            yield {k: v.to(device, non_blocking=True) for k, v in batch.items()}
        if state.batch_in_epoch == 0:
            raise StackWiseError(
                "The training data gave no full batch in an epoch (each process needs "
                "train.batch_size sequences; a stream trains on what its data.stream_val_blocks "
                "validation blocks leave). Add data, or lower train.batch_size or "
                "data.stream_val_blocks."
            )
        state.epoch += 1
        state.batch_in_epoch = 0
        state.stream_position = None


class TrainingData:
    """The training set as the loop reads it: a seeded order sharded by rank, whose position is
    the run state's (epoch, batch in epoch), or a stream that goes on from its recorded
    position. `loading`: (batch size, loader workers, seed)."""

    def __init__(self, data: Dataset, train: Any, workers: int, rank: int, world: int) -> None:
        self.data, self.shard = data, (rank, world)
        self.sampler = training_sampler(data, train, rank, world)
        self.loading = (train.batch_size, workers, train.seed)

    def loader(self, state: Any, start: int) -> DataLoader:
        """The current epoch's loader from batch `start` on (a stream: from its position)."""
        if self.sampler is None:  # a stream goes on from its recorded position
            assert isinstance(self.data, StreamedBlocks)
            at = state.stream_position
            return stream_loader(self.data, at, self.shard, self.loading, state.epoch)
        return epoch_loader(self.data, self.sampler, state.epoch, start, self.loading)

    def batches(self, state: Any, device: torch.device) -> Iterator[dict[str, torch.Tensor]]:
        """Endless batches from `state`'s position on, advancing it."""
        return batch_stream(lambda start: self.loader(state, start), state, device)
