"""Every size limit MEM holds a boundary to, in one place; where two boundaries meet, one limit is derived from the
other, so that what one side accepts the other side takes.

The chain a model goes down: an export (``mem_core/runs/export.py``) is accepted only if the live server can serve it and
the wire (``mem_core/protocol/``) can carry what the server then publishes, and the viewer draws whatever the wire
carries. A training config (``mem_core/train/configs.py``) is held to the same model limits, so a model that trains
also exports. Imports nothing of MEM's: the viewer, the command line and every reader use it.
"""

from __future__ import annotations

from typing import Any

# ------------------------------------------------------------------------------------ sensors and event windows

# A sensor side from a file, a corpus, a simulator or an events message: several times the largest event sensor
# made (1280 x 960), small enough that one (2, H, W) float32 histogram stays within 512 MiB.
MAX_SENSOR_SIDE = 8192
MAX_WINDOW_EVENTS = 1_000_000  # events of one live window (15 MB in the server's ring); the paper's models take 30 000
MAX_WINDOW_MS = 10_000.0  # time span of one live window
MAX_SIM_OBJECTS = 256  # moving shapes of the simulated camera (its rendering time grows with them)
MAX_SYNTHETIC_MEV_S = 1000.0  # rate of the synthetic load-test source (the fastest cameras: about 1000 Mev/s)

# --------------------------------------------------------------------------------------------------- the wire

MAX_HEADER_BYTES = 1 << 20  # a message's JSON header
MAX_JSON_DEPTH = 16  # nesting of a header (the deepest the server writes is 4: a reply's state.source.replay)
MAX_BUFFERS = 16  # raw frames after the header
MAX_NDIM = 8  # dimensions of one buffer
MAX_ELEMENTS = 1 << 40  # product of a buffer's non-zero sizes (an empty buffer could otherwise declare any shape)
MAX_SEQ = (1 << 63) - 1  # a message's sequence number
MAX_IPC_PATH = 107  # bytes of a Unix socket path (ipc:// endpoints)
MAX_TEXT = 1024  # characters of a free text field: a path, an error message, a session name
MAX_IMAGE_SIDE = 2048  # px of a picture the viewer draws: the model input, a mask, a token grid, the sensor view
MAX_NUM_TOKENS = 1 << 16  # codebook size a token grid may declare (the paper's dVAE has 8192)

# -------------------------------------------------------------------------------------------------- class sets

MAX_CLASSES = 1000  # classes of a model or a labels corpus: ImageNet's and N-ImageNet's 1000
# The largest header the server writes is a control reply: the model's classes, the names offered for labelling
# (the model's plus those captured under other names) and the captures per name, so every name up to 4 times.
NAME_COPIES = 4
CHAR_BYTES = 4  # UTF-8 bytes of a printable character (headers are UTF-8; JSON escapes no printable character more)
NAME_FRAMING = 4  # bytes around a name in a JSON list: two quotes, a comma and a space
COUNT_BYTES = 21  # bytes after a name in the captures per name: ": " and a count below 2^63
HEADER_RESERVE = 128 << 10  # the rest of a stats message or reply: about 20 texts of MAX_TEXT characters, numbers
# The longest class name that keeps the largest reply within MAX_HEADER_BYTES (55 characters).
MAX_CLASS_NAME = ((MAX_HEADER_BYTES - HEADER_RESERVE) // MAX_CLASSES - NAME_COPIES * NAME_FRAMING - COUNT_BYTES) // (
    NAME_COPIES * CHAR_BYTES
)
MAX_LABEL_NAMES = 2 * MAX_CLASSES  # names offered for labelling: a model's classes and the labels corpus's own
MAX_LABEL = MAX_CLASS_NAME  # a captured window's label becomes a class name of the labels corpus

# ------------------------------------------------------------------------------------------ live control

MAX_SPEED = 1000.0  # replay and simulator speed, x real time
MAX_SEEK_S = 1e9  # a replay position (31 years): in microseconds it stays a 64-bit integer
MAX_TRAIN_EPOCHS = 10_000  # epochs of a run on labelled captures (tens of samples: 150 is the default)

# ------------------------------------------------------------------------------------------------------ models

MAX_INPUT_SIDE = MAX_IMAGE_SIDE  # the viewer draws the model input and a segmenter's mask at the input's size
MAX_PATCHES = 4096  # tokens a ViT attends over, a 64 x 64 grid (ViT-B/16 at 224 px: 196; the DSEC preset: 1024)
MAX_DEPTH = 256  # transformer blocks, tokenizer layers and residual blocks: bounds the time to build a model
MAX_WIDTH = 8192  # embedding, hidden and codebook widths, attention heads, head channels (ViT-B: 768)
MAX_MLP_RATIO = 16.0
MAX_TEMPORAL_BINS = 64
MAX_MAGNITUDE = 30  # top of RandAugment's magnitude scale (torchvision's 31 bins, 0..30)
MAX_CHANNELS = 2 * MAX_TEMPORAL_BINS  # model input channels: OFF and ON per time bin
MAX_PARAMETERS = 1 << 30  # 4 GiB of float32 weights: ViT-H has 632 M, the paper's ViT-B 86 M
MAX_DERIVED_BYTES = 2 << 30  # buffers a model computes itself: ViT-B/16 at 224 px needs 4 MB, at 512 px 100 MB
# Floating-point operations of one live window (model and tokenizer each): ViT-B/16 at 224 px takes 35 G, the DSEC
# segmentation preset (512 px) 356 G; a CPU thread doing 20 GFLOP/s needs 50 s for the largest.
MAX_WINDOW_FLOPS = 10**12
MAX_EXPORT_WINDOW_EVENTS = MAX_WINDOW_EVENTS  # an export's n_max: the server serves it on windows of that many events
MAX_EXPORT_WINDOW_MS = MAX_WINDOW_MS  # the time span of an export's training samples: the server's default window


# ------------------------------------------------------------------------------- files a user names by path

# Each is read whole only after its size is checked (``mem_core.files``): the largest of each MEM writes is far below.
MAX_JSON_BYTES = 1 << 20  # a run's config.json, classes.json, result.json, links; an export's model.json: a few kB
MAX_CONFIG_BYTES = 1 << 20  # a TOML config (--config, a preset): the largest preset is 2 kB
MAX_CONFIG_DEPTH = 16  # nesting of a config value (TOML or --set): the configs nest 3 deep (a stage's data table)
# What a writer of events leaves free on its disk (a recording stops, a capture is refused, before it has less).
MIN_FREE_BYTES = 256 << 20
MAX_METRICS_BYTES = 256 << 20  # a run's metrics.jsonl: about 300 bytes an epoch, so a million epochs
MAX_LIST_BYTES = 64 << 20  # a dataset's list or split file: N-Caltech101's split file is 0.5 MB
# An export's safetensors weights (read whole, then copied into the model): MAX_PARAMETERS float32 tensors, plus as
# many bytes again for integer buffers and the header.
MAX_WEIGHTS_BYTES = 8 * MAX_PARAMETERS
# A checkpoint: model, EMA of the model and the optimizer's two moments, at the size of MAX_WEIGHTS_BYTES each.
MAX_CHECKPOINT_BYTES = 4 * MAX_WEIGHTS_BYTES

# ------------------------------------------------------------------------------------------ sockets the server reads

# libzmq's MAXMSGSIZE bounds each frame of a message, not how many frames one message has: one control request of
# 400 frames of 1 MiB grew the server by 800 MB. Every socket the server reads is read frame by frame and a message
# beyond these is dropped, frame by frame, as it is read.
MAX_CONTROL_FRAMES = 2  # a control request: topic and header
MAX_CONTROL_BYTES = 2 * MAX_HEADER_BYTES
MAX_EVENTS_FRAMES = 2 + MAX_BUFFERS  # an events message: topic, header and its columns
# Decoded events the ``tcp://`` source holds for its consumer (~10 M events, 0.3 s of a 30 Mev/s camera): a batch
# arriving beyond it is dropped and counted. ZMQ's queue counts messages only: 1000 large ones held 0.9 GB.
MAX_EVENT_QUEUE_BYTES = 128 << 20
# An events message: a header and a batch the queue can take, its four columns up to 8 bytes wide on the wire
# (13 bytes an event decoded).
MAX_EVENTS_BYTES = MAX_HEADER_BYTES + 4 * 8 * (MAX_EVENT_QUEUE_BYTES // 13)


def is_int(value: Any) -> bool:
    """Whether a JSON value is an integer (``true`` is not one, although Python's ``bool`` is an ``int``)."""
    return isinstance(value, int) and not isinstance(value, bool)


def fit_path(path: Any) -> str:
    """``path`` as a text field of at most ``MAX_TEXT`` characters: a longer one keeps its end (the file's name and
    the folders nearest to it) after an ellipsis. Paths may reach 4,096 bytes on Linux."""
    text = str(path)
    return text if len(text) <= MAX_TEXT else "\u2026" + text[-(MAX_TEXT - 1) :]


def deeper_than(value: Any, limit: int) -> bool:
    """Whether the dicts and lists of ``value`` nest more than ``limit`` containers deep, ``value`` itself counted:
    a config's tables, a message's JSON header. Walked without recursion, so a hostile input cannot exhaust the
    stack."""
    if not isinstance(value, dict | list):
        return False
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        for child in item.values() if isinstance(item, dict) else item:
            if isinstance(child, dict | list):
                if depth >= limit:
                    return True
                stack.append((child, depth + 1))
    return False
