"""MEM core library: events, file I/O, corpus, representation, models and training. No Qt, no sockets."""

import os

DATA_ENV = "MEM_DATA"


def shared_data_dir():
    """Where the real recordings live: ``$MEM_DATA`` or ``../shared/data`` beside the checkout."""
    from pathlib import Path

    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data"
