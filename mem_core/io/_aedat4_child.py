"""Decode one AEDAT4 file with dv-processing, in its own interpreter (see ``aedat4.py`` for why).

Usage: ``python _aedat4_child.py IN.aedat4 OUT.npy``. Writes dv's event array (fields timestamp, x, y, polarity)
to OUT.npy and prints ``{"width": W, "height": H}`` on stdout; on a decoding error prints one line to stderr and
exits with status 2. Standalone on purpose: it imports only numpy and dv-processing.
"""

import json
import sys

import dv_processing as dv
import numpy as np


def _first_line(error: Exception) -> str:
    """dv-processing messages carry a C++ location and a stack trace: keep the informative line."""
    lines = [ln.strip() for ln in str(error).split("Stacktrace:")[0].splitlines() if ln.strip()]
    return lines[-1] if lines else type(error).__name__


def main(src: str, dst: str) -> int:
    try:
        recording = dv.io.MonoCameraRecording(src)
        if not recording.isEventStreamAvailable():
            print("the recording has no event stream", file=sys.stderr)
            return 2
        width, height = recording.getEventResolution()
        batches = []
        while (batch := recording.getNextEventBatch()) is not None:
            batches.append(batch.numpy())
    except RuntimeError as e:
        print(_first_line(e), file=sys.stderr)
        return 2
    events = (
        np.concatenate(batches)
        if batches
        else np.empty(0, dtype=[("timestamp", "<i8"), ("x", "<i2"), ("y", "<i2"), ("polarity", "i1")])
    )
    np.save(dst, events, allow_pickle=False)
    print(json.dumps({"width": int(width), "height": int(height)}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], sys.argv[2]))
