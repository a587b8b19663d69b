"""A connected event camera as a live source (dv-processing 2.x), chosen by serial number, with reconnection.

The device layer is a small backend (``discover()`` and ``open(serial)``), so the source logic (no camera, serial
selection, unplug and re-plug) runs the same against the real dv-processing backend and a fake one in tests.

dv-processing facts this relies on: there is no ``dv.io.CameraCapture`` in 2.x; ``dv.io.camera.discover()``
lists ``DeviceDescriptor`` s (``cameraModel`` enum, ``serialNumber`` str) and ``dv.io.camera.open(serial)`` opens
one, raising a bare ``IndexError`` when nothing is connected, so ``discover()`` is always asked first.
``getNextEventBatch()`` returns ``None`` when no new data is there, and ``isRunning()`` turns false on unplug.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from mem_core.events import SensorSize, make_events
from recorders.base import HEARTBEAT_S, LiveSource, RecorderError, empty_batch

log = logging.getLogger(__name__)

# What a driver raises when the device goes away mid-call (dv-processing raises RuntimeError; open() on a device
# that vanished between discover() and open() raises IndexError).
_DEVICE_ERRORS = (RuntimeError, OSError, IndexError)


class NoCameraError(RecorderError):
    """No event camera is connected, or none with the requested serial number."""


@dataclass(frozen=True)
class CameraInfo:
    """A discovered camera: its model name and serial number."""

    model: str
    serial: str


class CameraHandle(Protocol):
    """An opened camera: its sensor, and non-blocking reads of the newest events."""

    sensor: SensorSize

    def read(self) -> np.ndarray | None:
        """The events that arrived since the last read (``EVENT_DTYPE``), or None when there are none."""

    def is_running(self) -> bool:
        """False once the device is unplugged or failed."""

    def close(self) -> None:
        """Release the device."""


class CameraBackend(Protocol):
    """Finds and opens cameras."""

    def discover(self) -> list[CameraInfo]: ...

    def open(self, serial: str) -> CameraHandle: ...


class DvHandle:
    """A dv-processing camera or network reader (an ``InputBase``) seen as a ``CameraHandle``."""

    def __init__(self, camera: Any) -> None:
        resolution = camera.getEventResolution()  # (width, height), None without an event stream
        if resolution is None:
            raise RecorderError(f"camera {camera.getCameraName()} has no event stream")
        self._camera = camera
        self.sensor = SensorSize(int(resolution[1]), int(resolution[0]))

    def read(self) -> np.ndarray | None:
        store = self._camera.getNextEventBatch()
        if store is None or store.isEmpty():
            return None
        a = store.numpy()  # fields timestamp <i8, x <i2, y <i2, polarity i1: converted by name
        return make_events(a["timestamp"], a["x"], a["y"], a["polarity"])

    def is_running(self) -> bool:
        return bool(self._camera.isRunning())

    def close(self) -> None:
        self._camera = None  # dv-processing releases the USB device when the object is destroyed


class DvCameraBackend:
    """Cameras through dv-processing's ``dv.io.camera`` (iniVation DVXplorer, DAVIS, DVS128...)."""

    def discover(self) -> list[CameraInfo]:
        import dv_processing as dv

        return [CameraInfo(d.cameraModel.name, str(d.serialNumber)) for d in dv.io.camera.discover()]

    def open(self, serial: str) -> CameraHandle:
        import dv_processing as dv

        return DvHandle(dv.io.camera.open(serial))


class CameraSource(LiveSource):
    """Events from a connected camera (the first one found, or the one with ``serial``).

    When the camera is unplugged the stream does not end: with ``reconnect`` the source waits for the same serial
    number to come back (yielding heartbeats meanwhile) and continues, for at most ``reconnect_timeout_s``
    (None = forever). Times stay monotonic across a reconnection. ``reconnects`` counts them and ``connected``
    says whether the camera is currently there (for a status line).
    """

    def __init__(
        self,
        serial: str | None = None,
        *,
        backend: CameraBackend | None = None,
        reconnect: bool = True,
        reconnect_timeout_s: float | None = None,
        retry_interval_s: float = 0.5,
        poll_interval_s: float = 0.001,
    ) -> None:
        self._backend = backend if backend is not None else DvCameraBackend()
        self.reconnect, self.reconnect_timeout_s = reconnect, reconnect_timeout_s
        self.retry_interval_s, self.poll_interval_s = retry_interval_s, poll_interval_s
        self.info = self._find(serial)
        try:
            self._handle: CameraHandle | None = self._backend.open(self.info.serial)
        except _DEVICE_ERRORS as e:
            raise NoCameraError(f"event camera {self.info.model} {self.info.serial} could not be opened: {e}") from e
        self.sensor = self._handle.sensor
        self.reconnects = 0
        self._closed = False
        self.metadata = {
            "kind": "camera",
            "model": self.info.model,
            "serial": self.info.serial,
            "height": self.sensor.height,
            "width": self.sensor.width,
        }

    @property
    def connected(self) -> bool:
        return self._handle is not None

    def _find(self, serial: str | None) -> CameraInfo:
        cameras = self._backend.discover()
        if not cameras:
            raise NoCameraError("no event camera found (is it plugged in, and may this user access USB devices?)")
        if serial is None:
            return cameras[0]
        for camera in cameras:
            if camera.serial == serial:
                return camera
        found = ", ".join(f"{c.model} {c.serial}" for c in cameras)
        raise NoCameraError(f"no event camera with serial {serial!r} found; connected: {found}")

    def __iter__(self) -> Iterator[np.ndarray]:
        offset = 0  # added to camera times so they never go back (a re-plugged camera may restart its clock)
        last_t: int | None = None
        last_yield = time.monotonic()
        while not self._closed:
            if self._handle is None:
                yield from self._wait_for_camera()
                continue
            try:
                batch = self._handle.read()
                running = batch is not None or self._handle.is_running()
            except _DEVICE_ERRORS as e:
                log.warning("camera %s failed: %s", self.info.serial, e)
                batch, running = None, False
            if batch is not None and batch.size:
                if last_t is not None and int(batch["t"][0]) + offset < last_t:
                    offset = last_t - int(batch["t"][0])
                if offset:
                    batch = batch.copy()
                    batch["t"] += offset
                last_t = int(batch["t"][-1])
                last_yield = time.monotonic()
                yield batch
            elif not running:
                self._drop_handle()
            elif time.monotonic() - last_yield >= HEARTBEAT_S:
                last_yield = time.monotonic()
                yield empty_batch()
            else:
                time.sleep(self.poll_interval_s)

    def _wait_for_camera(self) -> Iterator[np.ndarray]:
        """Re-open the same serial number once it is discovered again, yielding heartbeats while waiting."""
        serial = self.info.serial
        if not self.reconnect:
            raise RecorderError(f"event camera {serial} disconnected")
        log.warning("camera %s disconnected; waiting for it to come back", serial)
        deadline = None if self.reconnect_timeout_s is None else time.monotonic() + self.reconnect_timeout_s
        while not self._closed:
            try:
                if any(c.serial == serial for c in self._backend.discover()):
                    handle = self._backend.open(serial)
                    if handle.sensor != self.sensor:
                        handle.close()
                        raise RecorderError(f"camera {serial} came back with sensor {handle.sensor}, was {self.sensor}")
                    self._handle = handle
                    self.reconnects += 1
                    log.warning("camera %s reconnected", serial)
                    return
            except _DEVICE_ERRORS as e:
                log.warning("camera %s not ready yet: %s", serial, e)
            if deadline is not None and time.monotonic() > deadline:
                raise RecorderError(
                    f"event camera {serial} disconnected and was not back within {self.reconnect_timeout_s} s"
                )
            yield empty_batch()
            time.sleep(self.retry_interval_s)

    def _drop_handle(self) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                handle.close()
            except _DEVICE_ERRORS as e:
                log.warning("closing the disconnected camera %s failed: %s", self.info.serial, e)

    def close(self) -> None:
        self._closed = True
        self._drop_handle()
