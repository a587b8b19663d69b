"""What a stage trains and validates on: the data splits as a model sees them (unlabeled recordings joined to the
training split), the labelled samples it learns from, the epoch's batches and the loaders that read them.

Determinism: ``EpochBatchSampler`` draws each epoch's batches from ``(seed, epoch)`` and every sample's augmentation
from ``(seed, epoch, index)`` (``datasets.sample_rng``), so a resumed run reproduces the uninterrupted one and the
samples a step sees do not depend on the number of DDP processes or DataLoader workers.
"""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Sampler

from mem_core.adapters import shutdown_loader_workers
from mem_core.cores import usable_cores
from mem_core.datasets import (
    EventSource,
    WindowDataset,
    collate_windows,
    label_subset,
    open_shipped,
    open_source,
)
from mem_core.datasets.preload import preload
from mem_core.errors import MemError
from mem_core.train.runtime import Runtime

MAX_AUTO_WORKERS = 8  # on a many-core host, not dozens of processes each holding its own readers and buffers


def open_split(cfg, split: str) -> EventSource:
    data = cfg.data
    checks = {"verify": data.verify, "skip_bad": data.skip_bad} if data.dataset == "corpus" else {}
    return open_for_input(
        data.dataset, data.path or None, split, cfg.input, split_file=data.split_file, held_out=data.held_out, **checks
    )


def open_training(cfg) -> tuple[EventSource, dict[str, Any] | None]:
    """The training split, and with ``data.unlabeled`` those recordings joined to it, every label dropped
    (``datasets.unlabeled``): the source, and what it was (None without unlabeled recordings)."""
    from mem_core.datasets.unlabeled import JoinedSource, describe, open_unlabeled

    source = open_split(cfg, cfg.data.train_split)
    if not cfg.data.unlabeled:
        return source, None
    described = [describe(path, source.sensor) for path in cfg.data.unlabeled]
    extra = [open_unlabeled(path, source.sensor, cfg.input.n_max) for path in cfg.data.unlabeled]
    joined = JoinedSource([source, *extra])
    data = cfg.data
    split = {"dataset": data.dataset, "path": data.path, "split": data.train_split, "samples": len(source)}
    return joined, {"samples": len(joined), "train_split": split, "unlabeled": described}


def open_for_input(
    dataset: str, path, split: str, spec, *, split_file: str = "", held_out: bool = True, **options
) -> EventSource:
    """A dataset's samples as a model with input ``spec`` sees them, for training and evaluation alike; without
    ``held_out`` the splits as shipped (``registry.open_shipped``)."""
    if dataset == "ncaltech101" and split_file:
        options["split_file"] = split_file
    if dataset == "corpus":  # one sample per model window, so an epoch reads the corpus once
        options["window"] = spec.n_max
    return (open_source if held_out else open_shipped)(dataset, path, split, **options)


def train_indices(cfg, source: EventSource) -> np.ndarray:
    """The training samples: a stratified label fraction (when < 1) and an optional cap."""
    if cfg.data.label_fraction < 1:
        labelled = source.labels >= 0
        if not labelled.all():
            raise ValueError(f"{cfg.data.dataset}: label_fraction={cfg.data.label_fraction} needs a labelled dataset")
        idx = label_subset(source.labels, cfg.data.label_fraction, cfg.data.label_seed)
    else:
        idx = np.arange(len(source))
    if cfg.data.max_samples > 0 and len(idx) > cfg.data.max_samples:
        idx = np.sort(np.random.default_rng(cfg.data.label_seed).permutation(idx)[: cfg.data.max_samples])
    return idx


class EpochBatchSampler(Sampler[list[tuple[int, int]]]):
    """Batches of ``(index, key)`` pairs: a seeded permutation per epoch, the global batch split over ranks; ``key``
    seeds the sample's augmentation (``WindowDataset``). With ``epoch_samples`` beyond ``n`` (training on a few
    labels with the steps of many), an epoch makes several passes over the samples, each in its own order, the last
    one cut at ``epoch_samples``; a pass's key is ``epoch * passes + pass``, so every pass draws its own augmentations,
    and one pass keys its samples with the epoch itself.

    Training (``drop_last``): each rank gets the slice ``[rank * b, (rank + 1) * b)`` of every global batch
    (``b = global_batch / world``), so one process with batch B and N processes with batch B/N see the same samples
    in the same steps. Evaluation: each global batch is shared out as evenly as the ranks allow and a rank with no
    share of the last batch gets no batch at all, so every sample is counted exactly once (no padding duplicates,
    no empty batch).
    """

    def __init__(
        self,
        n: int,
        global_batch: int,
        *,
        seed: int,
        shuffle: bool,
        drop_last: bool,
        rank: int = 0,
        world_size: int = 1,
        epoch_samples: int = 0,
    ):
        if n <= 0:
            raise ValueError("cannot sample from an empty dataset")
        if epoch_samples < 0 or (epoch_samples > n and not (shuffle and drop_last)):
            raise ValueError(f"epoch_samples {epoch_samples}: several passes an epoch are for training (shuffled)")
        if global_batch < 1 or (drop_last and global_batch % world_size):
            raise ValueError(f"batch_size {global_batch} must be a positive multiple of the {world_size} processes")
        self.n, self.global_batch, self.seed = n, global_batch, seed
        self.shuffle, self.drop_last = shuffle, drop_last
        self.rank, self.world_size = rank, world_size
        self.per_rank = global_batch // world_size
        self.samples = epoch_samples or n  # drawn per epoch
        self.passes = -(-self.samples // n)
        self.epoch = 0
        self.endless = False  # iterate on into the epochs after ``epoch`` (``EpochStream``)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _order(self, epoch: int) -> tuple[np.ndarray, np.ndarray]:
        """(sample positions, augmentation keys) of ``epoch``, in order."""
        if not self.shuffle:
            return np.arange(self.n), np.full(self.n, epoch)
        if self.passes == 1:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.n)[: self.samples]
            return order, np.full(len(order), epoch)
        passes = [np.random.default_rng([self.seed, epoch, k]).permutation(self.n) for k in range(self.passes)]
        keys = epoch * self.passes + np.repeat(np.arange(self.passes), self.n)
        return np.concatenate(passes)[: self.samples], keys[: self.samples]

    def _global_batches(self) -> int:
        total = self.samples
        if self.drop_last:
            return max(total // self.global_batch, 1 if total < self.global_batch else 0)
        return math.ceil(total / self.global_batch)

    def _share(self, start: int, size: int) -> tuple[int, int]:
        """(first, count) of this rank's part of a global batch of ``size`` samples beginning at ``start``."""
        if self.drop_last:
            return start + self.rank * self.per_rank, self.per_rank
        base, extra = divmod(size, self.world_size)  # the first ``extra`` ranks take one more
        return start + self.rank * base + min(self.rank, extra), base + (self.rank < extra)

    def __len__(self) -> int:
        if self.drop_last:
            return self._global_batches()
        sizes = (min(self.global_batch, self.n - b * self.global_batch) for b in range(self._global_batches()))
        return sum(1 for size in sizes if self._share(0, size)[1] > 0)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        epoch = self.epoch
        while True:
            yield from self._batches(epoch)
            if not self.endless:
                return
            epoch += 1

    def _batches(self, epoch: int) -> Iterator[list[tuple[int, int]]]:
        order, keys = self._order(epoch)
        if self.drop_last and len(order) < self.global_batch:
            # fewer samples than one batch (a few labelled captures): repeat the permutation to fill one batch
            order, keys = np.resize(order, self.global_batch), np.resize(keys, self.global_batch)
        for b in range(self._global_batches()):
            start = b * self.global_batch
            first, count = self._share(start, min(self.global_batch, len(order) - start))
            if count > 0:
                pairs = zip(order[first : first + count], keys[first : first + count], strict=True)
                yield [(int(i), int(k)) for i, k in pairs]


class EpochStream:
    """A training loader read epoch after epoch from one iterator, ``set_epoch`` then one epoch's batches at a time.

    A loader iterated anew each epoch leaves its workers idle from its last batch until the next epoch asks for its
    first, and then one worker builds that whole batch while the device waits: on a GPU an epoch of a few thousand
    windows lasts about a second and a batch of 256 takes a worker a fifth of that. Read on from one iterator, the
    workers build the next epoch's first batches during the last steps of this one, its validation and checkpoint.
    The batches are the same: each epoch's order and augmentations come from the seed and the epoch alone
    (``EpochBatchSampler``, ``WindowDataset``). An epoch other than the next one (a resumed run) starts afresh.
    """

    def __init__(self, loader: DataLoader, sampler: EpochBatchSampler) -> None:
        self.loader, self.sampler = loader, sampler
        self._batches: Iterator[Any] | None = None
        self._next_epoch: int | None = None

    def set_epoch(self, epoch: int) -> None:
        if self._batches is None or epoch != self._next_epoch:
            self.sampler.set_epoch(epoch)
            self.sampler.endless = True
            self._batches = iter(self.loader)
        self._next_epoch = epoch + 1

    def __iter__(self) -> Iterator[Any]:
        if self._batches is None:
            raise RuntimeError("EpochStream: set_epoch before the first epoch")
        return itertools.islice(self._batches, len(self.sampler))

    def __len__(self) -> int:
        return len(self.sampler)


def loader_workers(num_workers: int, world_size: int = 1) -> int:
    """The loader processes of one training process: ``num_workers``, or for -1 (auto) the cores this machine
    gives the process (the cores it may run on, shared by ``world_size`` processes), at most ``MAX_AUTO_WORKERS``."""
    if num_workers >= 0:
        return num_workers
    return max(1, min(MAX_AUTO_WORKERS, usable_cores() // max(1, world_size)))


def build_loader(
    source: EventSource,
    spec,
    *,
    train: bool,
    seed: int,
    batch_size: int,
    runtime: Runtime,
    num_workers: int,
    indices: np.ndarray | None = None,
    epoch_samples: int = 0,
    preload_mib: int = 0,
) -> tuple[DataLoader, EpochBatchSampler]:
    """A DataLoader of event windows (EventBatch); ``batch_size`` is global (split over the DDP processes);
    ``num_workers`` -1 is ``loader_workers``' automatic count; ``epoch_samples`` (training): the samples an epoch
    draws, in passes over the dataset (``EpochBatchSampler``); ``preload_mib``: samples stored one per file are
    decoded once into memory when they fit (``datasets.preload``), before the workers start and share them."""
    num_workers = loader_workers(num_workers, runtime.world_size)
    if preload_mib > 0:
        used = np.arange(len(source)) if indices is None else np.asarray(indices, dtype=np.int64)
        source = preload(source, used, preload_mib * 2**20, say=_say if runtime.is_main else None)
    dataset = WindowDataset(source, spec, train=train, seed=seed, indices=indices)
    sampler = EpochBatchSampler(
        len(dataset),
        batch_size,
        seed=seed,
        shuffle=train,
        drop_last=train,
        rank=runtime.rank,
        world_size=runtime.world_size,
        epoch_samples=epoch_samples,
    )
    loader = _Loader(
        dataset,
        batch_sampler=sampler,
        num_workers=num_workers,
        collate_fn=_Collate(source.sensor),
        pin_memory=runtime.device.type == "cuda",
        persistent_workers=num_workers > 0,  # the sampler lives in this process: workers can stay
        # Starting workers draws their base seed; from torch's global generator that draw would shift dropout, drop
        # path and masking in the epoch the workers start - epoch 0 in a run, the resumed epoch after --resume.
        generator=torch.Generator().manual_seed(seed),
    )
    return loader, sampler


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def worker_error(exc: BaseException) -> MemError | None:
    """The library's error behind a DataLoader worker's wrapped exception, as the one line it was, or None.

    A worker's exception reaches the main process re-raised by torch with a "Caught ... in DataLoader worker process
    N" preamble and the worker's traceback in the message (or as a RuntimeError when the type cannot be rebuilt from
    one string); a damaged corpus shard or event file should read as it does without workers."""
    first, _, rest = str(exc).partition("\n")
    if not (first.startswith("Caught ") and "in DataLoader worker process" in first):
        return None
    name, _, message = rest.strip().splitlines()[-1].partition(": ")
    return MemError(message) if name.startswith("mem_core.") and message else None


class _Loader(DataLoader):
    """A DataLoader whose workers' library errors surface as they would in this process (see ``worker_error``)."""

    def __iter__(self) -> Iterator[Any]:
        batches = super().__iter__()
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                return
            except Exception as exc:
                original = worker_error(exc)
                if original is None:
                    raise
                raise original from None
            yield batch

    def close(self) -> None:
        """Stop the persistent workers now. Left to the garbage collector (a stage's loaders sit in reference
        cycles), the workers' queues can be torn down before the iterator tells the workers to stop, and torch
        then waits its 5 s join timeout for each worker: seconds of stall at a random later moment."""
        shutdown_loader_workers(self)


def build_stage_loaders(cfg, runtime: Runtime, train_src: EventSource, val_src: EventSource, indices=None):
    """The training loader (random windows, augmented), its sampler, and the validation loader (deterministic)."""
    common = {
        "seed": cfg.seed,
        "batch_size": cfg.batch_size,
        "runtime": runtime,
        "num_workers": cfg.data.num_workers,
        "preload_mib": cfg.data.preload_mib,
    }
    loader, sampler = build_loader(
        train_src, cfg.input, train=True, indices=indices, epoch_samples=cfg.data.epoch_samples, **common
    )
    val_loader, _ = build_loader(val_src, cfg.input, train=False, **common)
    return loader, sampler, val_loader


class _Collate:
    """Picklable collate for worker processes."""

    def __init__(self, sensor):
        self.sensor = sensor

    def __call__(self, items):
        return collate_windows(items, self.sensor)
