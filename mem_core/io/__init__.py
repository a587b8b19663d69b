"""Event file readers and writers: ``read_events(path) -> EventFile(events, sensor)`` for every format.

One module per format family: ``nbin`` (N-MNIST / N-Caltech101 ``.bin``), ``prophesee`` (``.dat`` and EVT 2.0 /
3.0 ``.raw``, decoders in ``evt``), ``aedat4`` (iniVation, decoded in-process), ``npz`` (N-ImageNet), ``hdf5``
(DSEC) and ``evz`` (MEM's packed files; ``pack.pack_folder`` packs a dataset folder). ``registry`` picks the reader
by content, then extension, and lets other stores plug in.
"""

from mem_core.io.base import EventFile, EventFileError
from mem_core.io.registry import describe, detect_format, formats, read_events, register_reader, write_events

__all__ = [
    "EventFile",
    "EventFileError",
    "describe",
    "detect_format",
    "formats",
    "read_events",
    "register_reader",
    "write_events",
]
