"""Event histograms at sensor resolution, for one window or a batch of windows.

Histograms are float32 with exact counts (no uint8/int16 wrap-around):

- ``event_histogram``      (2, H, W): channel 0 = OFF, 1 = ON.
- ``temporal_histogram``   (2 * bins, H, W): channel ``2 * b + p`` counts polarity ``p`` in time bin ``b``.
- ``timestamp_histogram``  (3, H, W): OFF and ON counts, then the normalized time of each pixel's newest event.

A batch of windows travels as an ``EventBatch`` (the windows' events back to back in columns, made by
``collate_events`` in the DataLoader worker); ``batch_histogram`` counts it with the numba kernels on CPU and one
scatter-add elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from numba import njit
from torch.utils.data import get_worker_info

from mem_core.events import EVENT_DTYPE, SensorSize
from mem_core.representation.spec import Channels, n_channels

# float32 holds every integer up to 2**24 exactly, so a window of at most that many events is counted straight
# into float32; longer streams are counted in int64 and converted (counts above 2**24 then round to float32).
FLOAT32_EXACT = 2**24


@njit(cache=True, nogil=True)
def _count_kernel(x, y, p, counts):
    """``counts[p, y, x] += 1`` per event; returns how many events were skipped as out of range."""
    height, width = counts.shape[1], counts.shape[2]
    skipped = 0
    for i in range(x.shape[0]):
        xi, yi, pi = x[i], y[i], p[i]
        if 0 <= xi < width and 0 <= yi < height and 0 <= pi < 2:
            counts[pi, yi, xi] += 1
        else:
            skipped += 1
    return skipped


@njit(cache=True, nogil=True)
def _temporal_kernel(t, x, y, p, t0, ticks, counts):
    """``counts[b, p, y, x] += 1`` with time bin ``b = (t - t0) * bins // ticks``; returns the skipped count."""
    bins, height, width = counts.shape[0], counts.shape[2], counts.shape[3]
    skipped = 0
    for i in range(x.shape[0]):
        b = (t[i] - t0) * bins // ticks
        xi, yi, pi = x[i], y[i], p[i]
        if 0 <= b < bins and 0 <= xi < width and 0 <= yi < height and 0 <= pi < 2:
            counts[b, pi, yi, xi] += 1
        else:
            skipped += 1
    return skipped


@njit(cache=True, nogil=True)
def _timestamp_kernel(t, x, y, p, t0, span, counts, newest):
    """Counts as ``_count_kernel`` plus ``newest[y, x] = (t - t0) / span`` of the pixel's last event."""
    height, width = counts.shape[1], counts.shape[2]
    skipped = 0
    for i in range(x.shape[0]):
        dt = t[i] - t0
        xi, yi, pi = x[i], y[i], p[i]
        if 0 <= dt <= span and 0 <= xi < width and 0 <= yi < height and 0 <= pi < 2:
            counts[pi, yi, xi] += 1
            # Events are sorted by time, so the last write is the newest event; a zero span means "all newest".
            newest[yi, xi] = dt / span if span > 0 else 1.0
        else:
            skipped += 1
    return skipped


def _fill_histogram(out: np.ndarray, channels: str, t, x, y, p) -> int:
    """Fill the zeroed float32 ``out`` (C, H, W) from event columns; returns the number of skipped events."""
    n = len(x)
    if n == 0:
        return 0
    n_counts = 2 if channels == "timestamp" else out.shape[0]
    exact = n <= FLOAT32_EXACT
    counts = out[:n_counts] if exact else np.zeros((n_counts, *out.shape[1:]), np.int64)
    if channels == "hist":
        skipped = _count_kernel(x, y, p, counts)
    elif channels == "temporal":
        height, width = out.shape[1:]
        t0 = int(t[0])
        ticks = int(t[-1]) - t0 + 1  # the window covers ticks microseconds [t0, t_last], split evenly into bins
        skipped = _temporal_kernel(t, x, y, p, t0, ticks, counts.reshape(-1, 2, height, width))  # (bins, 2, H, W)
    else:
        skipped = _timestamp_kernel(t, x, y, p, int(t[0]), int(t[-1]) - int(t[0]), counts, out[2])
    if not exact:
        out[:n_counts] = counts
    return skipped


def _skipped_error(skipped: int, n: int, sensor: SensorSize) -> ValueError:
    return ValueError(
        f"{skipped} of {n} events fall outside the sensor {sensor.width}x{sensor.height} (width x height), "
        f"have polarity > 1, or are not sorted by time"
    )


def input_histogram(events: np.ndarray, sensor: SensorSize, channels: Channels = "hist", bins: int = 4) -> np.ndarray:
    """Histogram of ``events`` at sensor resolution: float32 (C, H, W) for ``channels`` (see module docstring)."""
    if not isinstance(events, np.ndarray) or events.dtype != EVENT_DTYPE:
        raise ValueError(f"events must be a numpy array of EVENT_DTYPE, got {getattr(events, 'dtype', type(events))}")
    if sensor.height <= 0 or sensor.width <= 0:
        raise ValueError(f"sensor must have a positive size, got {sensor}")
    out = np.zeros((n_channels(channels, bins), sensor.height, sensor.width), np.float32)
    skipped = _fill_histogram(out, channels, events["t"], events["x"], events["y"], events["p"])
    if skipped:
        raise _skipped_error(skipped, len(events), sensor)
    return out


def event_histogram(events: np.ndarray, sensor: SensorSize) -> np.ndarray:
    """Exact per-pixel event counts, float32 (2, H, W): channel 0 = OFF, channel 1 = ON."""
    return input_histogram(events, sensor, "hist")


def temporal_histogram(events: np.ndarray, sensor: SensorSize, bins: int = 4) -> np.ndarray:
    """Counts per time bin and polarity, float32 (2 * bins, H, W); channel ``2 * b + p`` is bin ``b``, polarity ``p``.

    The bins split the window's time span ``[t_first, t_last]`` into ``bins`` equal parts; summing over the
    bins (``reshape(bins, 2, H, W).sum(0)``) gives ``event_histogram``.
    """
    return input_histogram(events, sensor, "temporal", bins)


def timestamp_histogram(events: np.ndarray, sensor: SensorSize) -> np.ndarray:
    """OFF and ON counts plus the newest event time per pixel, float32 (3, H, W).

    Channel 2 is ``(t_newest - t_first) / (t_last - t_first)`` in [0, 1] for pixels with events (1 when the
    window has zero duration) and 0 where there is no event.
    """
    return input_histogram(events, sensor, "timestamp")


# ----------------------------------------------------------------------------------------------- batched


@dataclass
class EventBatch:
    """Event windows of one sensor back to back: window ``b`` is ``lengths[b]`` events of the columns, from
    ``starts()[b]`` on. No padding: a batch of N-Cars windows moves its events, not 5 times their bytes."""

    t: torch.Tensor  # (E,) int64, microseconds
    x: torch.Tensor  # (E,) int32
    y: torch.Tensor  # (E,) int32
    p: torch.Tensor  # (E,) uint8, 0 = OFF, 1 = ON
    lengths: torch.Tensor  # (B,) int64, summing to E
    # (B, 2) int64 on the CPU, counted by collate_events: events off the sensor or with polarity > 1, and events
    # outside [t_first, t_last] of their window; read there, so refusing a bad batch never waits for a GPU
    flaws: torch.Tensor
    sensor: SensorSize

    def __len__(self) -> int:
        return self.lengths.shape[0]

    def bounds(self) -> torch.Tensor:
        """(B + 1,) window ``b``'s events are columns ``bounds[b]:bounds[b + 1]``."""
        return torch.cat([self.lengths.new_zeros(1), self.lengths.cumsum(0)])

    def starts(self) -> torch.Tensor:
        """(B,) the column index of each window's first event."""
        return self.bounds()[:-1]

    def window(self, b: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The columns ``t, x, y, p`` of window ``b`` (views)."""
        start = int(self.starts()[b])
        events = slice(start, start + int(self.lengths[b]))
        return self.t[events], self.x[events], self.y[events], self.p[events]

    def __getitem__(self, rows: slice) -> EventBatch:
        """The windows ``rows`` of the batch (a micro-batch), their events views of these columns."""
        if not isinstance(rows, slice):
            raise TypeError(f"an EventBatch is sliced by a slice of rows, got {type(rows).__name__}")
        first, last, step = rows.indices(len(self))
        if step != 1:
            raise ValueError(f"an EventBatch is sliced by contiguous rows, got step {step}")
        bounds = self.bounds()
        events = slice(int(bounds[first]), int(bounds[max(first, last)]))
        columns = (v[events] for v in (self.t, self.x, self.y, self.p))
        return EventBatch(*columns, self.lengths[rows], self.flaws[rows], self.sensor)

    def _map(self, fn) -> EventBatch:
        """``fn`` applied to the events and lengths (the flaw counts stay where they are)."""
        return EventBatch(fn(self.t), fn(self.x), fn(self.y), fn(self.p), fn(self.lengths), self.flaws, self.sensor)

    def to(self, device: str | torch.device, non_blocking: bool = False, *, times: bool = True) -> EventBatch:
        """The batch on ``device``; without ``times`` the timestamps stay where they are (counts never read them,
        and they are half of the bytes a batch moves)."""

        def move(v: torch.Tensor) -> torch.Tensor:
            return v.to(device, non_blocking=non_blocking)

        t = move(self.t) if times else self.t
        return EventBatch(t, move(self.x), move(self.y), move(self.p), move(self.lengths), self.flaws, self.sensor)

    def pin_memory(self) -> EventBatch:
        """Page-locked copy (called by ``DataLoader(pin_memory=True)``)."""
        return self._map(lambda v: v.pin_memory())

    def flawed(self, channels: Channels) -> torch.Tensor:
        """(B,) the events of each window that ``input_histogram`` would refuse for ``channels``."""
        return self.flaws[:, 0] + (self.flaws[:, 1] if channels != "hist" else 0)


def collate_events(windows: Sequence[np.ndarray], sensor: SensorSize) -> EventBatch:
    """The ``EVENT_DTYPE`` windows back to back in an ``EventBatch`` (usable inside a DataLoader ``collate_fn``).

    Inside a DataLoader worker the columns are allocated in shared memory, as torch's default collate does: sending
    them to the main process then moves no data (otherwise pickling copies them there).
    """
    for i, w in enumerate(windows):
        if not isinstance(w, np.ndarray) or w.dtype != EVENT_DTYPE or w.ndim != 1:
            raise ValueError(f"window {i} must be a 1-D numpy array of EVENT_DTYPE, got {getattr(w, 'dtype', w)}")
    lengths = np.array([len(w) for w in windows], np.int64)
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    shared = get_worker_info() is not None
    columns = tuple(_empty(int(bounds[-1]), dtype, shared) for dtype in (np.int64, np.int32, np.int32, np.uint8))
    t, x, y, p = (c.numpy() for c in columns)
    flaws = np.zeros((len(windows), 2), np.int64)
    for i, w in enumerate(windows):
        a, b = bounds[i], bounds[i + 1]
        flaws[i] = _unpack_kernel(w, t[a:b], x[a:b], y[a:b], p[a:b], sensor[0], sensor[1])
    return EventBatch(*columns, torch.from_numpy(lengths), torch.from_numpy(flaws), sensor=SensorSize(*sensor))


def _empty(n: int, dtype: type, shared: bool) -> torch.Tensor:
    """An uninitialized 1-D tensor, with its storage created in shared memory if ``shared``.

    Otherwise the memory comes from numpy, which backs arrays of >= 4 MB with transparent huge pages and so
    saves the page fault per 4 KB that a fresh torch tensor of the same size costs on first touch.
    """
    if not shared or n == 0:
        return torch.from_numpy(np.empty(n, dtype))
    storage = torch.UntypedStorage._new_shared(n * np.dtype(dtype).itemsize)
    return torch.empty(0, dtype=torch.from_numpy(np.empty(0, dtype)).dtype).set_(storage, 0, (n,))


@njit(cache=True, nogil=True)
def _unpack_kernel(events, t, x, y, p, height, width):
    """The fields of one window into the columns ``t, x, y, p`` (of its length); returns (events off the sensor or
    with polarity > 1, events outside [t_first, t_last])."""
    n = events.shape[0]
    off_sensor = 0
    out_of_span = 0
    for i in range(n):
        e = events[i]
        t[i], x[i], y[i], p[i] = e.t, e.x, e.y, e.p
        off_sensor += e.x >= width or e.y >= height or e.p > 1
        out_of_span += e.t < events[0].t or e.t > events[n - 1].t
    return off_sensor, out_of_span


def _batch_histogram_numba(batch: EventBatch, channels: str, num_channels: int) -> torch.Tensor:
    """The histograms of a CPU batch, one row at a time through the numba kernels."""
    height, width = batch.sensor
    out = np.zeros((len(batch), num_channels, height, width), np.float32)
    t, x, y, p = (v.numpy() for v in (batch.t, batch.x, batch.y, batch.p))
    for b, (a, n) in enumerate(zip(batch.starts().tolist(), batch.lengths.tolist(), strict=True)):
        skipped = _fill_histogram(out[b], channels, t[a : a + n], x[a : a + n], y[a : a + n], p[a : a + n])
        if skipped:
            raise ValueError(f"batch sample {b}: {_skipped_error(skipped, n, batch.sensor)}")
    return torch.from_numpy(out)


def scatter_histogram(batch: EventBatch, channels: Channels = "hist", bins: int = 4) -> torch.Tensor:
    """Histograms of ``batch`` on its device, float32 (B, C, H, W): one scatter-add of every event into the counts.

    Events that the numba kernels skip (off the sensor, polarity > 1, outside their window's time span for time bins
    and the timestamp) are left out here without a word: ``batch_histogram`` refuses a batch holding any. Nothing is
    read back to the host (no check, no boolean indexing, no ``bincount``, which reads its largest index), so the
    host queues the next work while the device counts. The counts add up in float32, exact up to 2^24 per pixel (a
    window holds at most that many events). ``batch.t`` is read only for time bins and the timestamp.
    """
    num_channels = n_channels(channels, bins)
    height, width = batch.sensor
    n_batch, n_events = len(batch), batch.x.shape[0]
    cells = n_batch * num_channels * height * width
    device = batch.x.device
    # the events left out land past the histograms, one slot per event (no single contended slot)
    counts = torch.zeros(cells + n_events, device=device)
    if n_events == 0:
        return counts[:cells].view(n_batch, num_channels, height, width)
    index_dtype = torch.int32 if cells + n_events < 2**31 else torch.int64
    x, y, p = (v.to(index_dtype) for v in (batch.x, batch.y, batch.p))
    position = torch.arange(n_events, device=device, dtype=index_dtype)  # (E,)
    lengths = batch.lengths.to(device)
    # each event's window; the output size is known here, so the device is not asked for it
    sample = torch.repeat_interleave(
        torch.arange(n_batch, device=device, dtype=index_dtype), lengths, output_size=n_events
    )
    keep = (x >= 0) & (x < width) & (y >= 0) & (y < height) & (p <= 1)
    channel = p
    if channels != "hist":
        t = batch.t
        first = batch.starts().to(device)  # (B,) an empty window's bounds are read by none of its events
        t0 = t[first.clamp_max(n_events - 1)][sample]  # (E,) the first and last time of each event's window
        t_last = t[(first + lengths - 1).clamp_min(0)][sample]
        keep &= (t >= t0) & (t <= t_last)
        if channels == "temporal":  # the even split of _temporal_kernel
            channel = 2 * ((t - t0) * bins // (t_last - t0 + 1)).to(index_dtype) + p
    cell = ((sample * num_channels + channel) * height + y) * width + x  # (E,) into (B, C, H, W)
    cell = torch.where(keep, cell, cells + position)
    counts.index_add_(0, cell, torch.ones((), device=device).expand(n_events))
    out = counts[:cells].view(n_batch, num_channels, height, width)
    if channels == "timestamp":
        span = (t_last - t0).to(torch.float64)
        newest = torch.where(span > 0, (t - t0) / span.clamp_min(1), 1.0).to(torch.float32)  # (E,)
        pixels = n_batch * height * width
        pixel = torch.where(keep, (sample * height + y) * width + x, pixels + position).long()
        plane = torch.zeros(pixels + n_events, device=device)
        plane.scatter_reduce_(0, pixel, newest, reduce="amax")  # sorted times: the newest
        out[:, 2] = plane[:pixels].view(n_batch, height, width)
    return out


def batch_histogram(
    batch: EventBatch,
    channels: Channels = "hist",
    bins: int = 4,
    *,
    device: str | torch.device = "cpu",
    backend: Literal["auto", "numba", "torch"] = "auto",
) -> torch.Tensor:
    """Histograms of a batch, float32 (B, C, H, W) on ``device``, equal to ``input_histogram`` per row.

    ``backend="auto"`` runs the numba kernels per sample on CPU (faster than a CPU scatter) and ``scatter_histogram``
    elsewhere. A window holding events that ``input_histogram`` refuses is an error naming it either way.
    """
    num_channels = n_channels(channels, bins)
    device = torch.device(device)
    if backend == "auto":
        backend = "numba" if device.type == "cpu" else "torch"
    if backend == "numba":
        if device.type != "cpu":
            raise ValueError(f"the numba backend runs on CPU only, got device {device}")
        return _batch_histogram_numba(batch.to("cpu"), channels, num_channels)
    if backend != "torch":
        raise ValueError(f"unknown histogram backend {backend!r}; expected 'auto', 'numba' or 'torch'")
    flawed = batch.flawed(channels)
    if flawed.any():
        b = int(flawed.nonzero()[0])
        raise ValueError(f"batch sample {b}: {_skipped_error(int(flawed[b]), int(batch.lengths[b]), batch.sensor)}")
    # pinned batches (DataLoader pin_memory) copy to a GPU without stalling the host; counts need no times
    return scatter_histogram(batch.to(device, non_blocking=True, times=channels != "hist"), channels, bins)
