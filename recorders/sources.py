"""``open_source(spec)``: the one way from a CLI string to a live source, for ``mem record`` and ``mem serve``.

=======================  ==============================================================================
``camera[:SERIAL]``      a connected event camera through dv-processing (the first found, or by serial)
``sim`` / ``sim:fast``   the built-in simulated camera (the ``sim`` dataset's camera / a denser scene)
``synthetic[:MEV_S]``    uniform random events at MEV_S million events/s (default 30), for load tests
``tcp://HOST:PORT``      event batches published by ``mem record --publish`` (also ``ipc://PATH``)
``dv+tcp://HOST:PORT``   the event stream of iniVation DV's TCP output or a dv-processing ``NetworkWriter``
``CORPUS[:RECORDING]``   a corpus directory replayed: one recording (name, session or index) or all in order
any other string         an event file in a format ``mem_core.io.read_events`` reads, replayed
=======================  ==============================================================================

Replays (a file, a corpus) can be paused, sought, stepped and sped up (``recorders.replay.Replay``).
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from mem_core.limits import MAX_SYNTHETIC_MEV_S
from mem_core.protocol import endpoint_problem
from recorders.base import LiveSource, RecorderError
from recorders.config import SPECS
from recorders.dv_network import SCHEME as DV_TCP

# Each kind of source is imported when it is opened: a camera or the simulator does not pay for the file readers,
# the corpus and their compiled kernels (h5py, numba).


def open_source(spec: str, *, speed: float = 1.0, loop: bool = False, batch_us: int = 10_000) -> LiveSource:
    """The source a CLI string names (see the module docstring).

    ``speed`` paces replays and the simulator (x real time; 0 = as fast as possible), ``loop`` replays a file or
    corpus over and over, ``batch_us`` is the time span of one batch from a replay or the simulator.
    """
    if spec.startswith(("tcp://", "ipc://")):
        if (problem := endpoint_problem(spec)) is not None:
            raise RecorderError(f"source {spec!r}: {problem}")
        from recorders.zmq_source import ZmqEventSource

        return ZmqEventSource(spec)
    if spec.startswith(DV_TCP):
        from recorders.dv_network import DvNetworkSource

        return DvNetworkSource(spec)
    kind, _, arg = spec.partition(":")
    if kind == "camera":
        from recorders.camera import CameraSource

        return CameraSource(arg or None)
    if kind == "sim":
        from mem_core.simulator import fast_config, task_config
        from recorders.simulated import SimulatorSource

        presets = {"": task_config, "fast": fast_config}
        if arg not in presets:
            raise RecorderError(f"unknown simulator preset {arg!r} in source {spec!r} (use sim or sim:fast)")
        return SimulatorSource(presets[arg](), batch_us=batch_us, speed=speed)
    if kind == "synthetic":
        try:
            rate = float(arg or 30)
        except ValueError:
            rate = math.nan
        if not 0 < rate <= MAX_SYNTHETIC_MEV_S:  # the source holds 2 ms of its events (26 MB at the largest)
            raise RecorderError(f"source {spec!r}: synthetic:MEV_S takes a rate in (0, {MAX_SYNTHETIC_MEV_S:g}] Mev/s")
        from recorders.synthetic import SyntheticSource

        return SyntheticSource(rate * 1e6)
    from recorders.corpus_replay import CorpusReplaySource, corpus_spec

    corpus = corpus_spec(spec)
    if corpus is not None:
        return CorpusReplaySource(*corpus, speed=speed, loop=loop, batch_us=batch_us)
    path = Path(spec)
    if not os.path.exists(path):  # a FIFO or a device goes on: the reader refuses it by name
        if path.suffix or os.sep in spec:  # written as a file: that it is missing is what the user needs to hear
            raise RecorderError(f"source {spec!r}: no such file or folder")
        raise RecorderError(f"source {spec!r} is not {SPECS}")
    if path.is_dir():
        from mem_core.corpus.format import MANIFEST

        raise RecorderError(f"source {spec!r} is a folder but no corpus (it holds no {MANIFEST})")
    from recorders.replay import ReplaySource

    return ReplaySource(path, speed=speed, loop=loop, batch_us=batch_us)
