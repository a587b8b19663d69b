"""A DV / dv-processing network event stream as a live source (``dv+tcp://HOST:PORT``), with reconnection.

Camera users often keep the camera in iniVation's DV (or another dv-processing program) and let other programs read
its TCP output (DV's "Network TCP server" output module, dv-processing's ``dv.io.NetworkWriter``). The stream is read
with ``dv.io.NetworkReader``, which behaves like an opened camera: ``getNextEventBatch()`` returns ``None`` when
nothing new is there, ``isRunning()`` turns false when the server goes away, and connecting to a port where nothing
listens raises ``RuntimeError`` ("Connection refused"). So the source is ``CameraSource`` over a backend whose one
"device" is the server: a dropped stream is waited for and re-connected exactly as an unplugged camera is, with time
kept monotonic across the gap.
"""

from __future__ import annotations

from typing import Any

from recorders.base import RecorderError
from recorders.camera import CameraInfo, CameraSource, DvHandle, NoCameraError

SCHEME = "dv+tcp://"


def parse_endpoint(spec: str) -> tuple[str, int]:
    """``dv+tcp://HOST:PORT`` -> (host, port), or a ``RecorderError`` naming what is wrong."""
    host, sep, port = spec.removeprefix(SCHEME).rpartition(":")
    digits = port.isascii() and port.isdigit() and len(port) <= 5  # int() refuses '²' and 5,000 digits
    if not spec.startswith(SCHEME) or not sep or not host or not digits or not 0 < int(port) < 65536:
        raise RecorderError(f"source {spec!r}: expected {SCHEME}HOST:PORT with a port in 1..65535")
    return host, int(port)


class DvNetworkBackend:
    """The one "camera" at ``host:port``: discovered by connecting, opened as that connection."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self._connected: Any = None  # the reader of the last successful discover(), handed to open()

    def discover(self) -> list[CameraInfo]:
        import dv_processing as dv

        try:
            reader = dv.io.NetworkReader(self.host, self.port)
        except RuntimeError:  # nothing listens there (yet)
            return []
        self._connected = reader
        return [CameraInfo(reader.getCameraName() or "dv-network", f"{self.host}:{self.port}")]

    def open(self, serial: str) -> DvHandle:
        import dv_processing as dv

        reader, self._connected = self._connected, None
        if reader is None:
            reader = dv.io.NetworkReader(self.host, self.port)
        if not reader.isEventStreamAvailable():
            raise RecorderError(f"{SCHEME}{serial} streams no events (is its output an event stream?)")
        return DvHandle(reader)


class DvNetworkSource(CameraSource):
    """Events from a DV / dv-processing TCP event stream; reconnects when the server restarts (see ``CameraSource``)."""

    def __init__(self, spec: str, **kwargs: Any) -> None:
        host, port = parse_endpoint(spec)
        super().__init__(f"{host}:{port}", backend=DvNetworkBackend(host, port), **kwargs)
        self.metadata.update(kind="dv-network", endpoint=f"{SCHEME}{host}:{port}")

    def _find(self, serial: str | None) -> CameraInfo:
        cameras = self._backend.discover()
        if not cameras:
            raise NoCameraError(
                f"nothing streams events at {SCHEME}{serial} (is DV's TCP output or a dv-processing NetworkWriter "
                "running there?)"
            )
        return cameras[0]
