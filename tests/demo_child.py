"""``mem demo`` at toy size: the settings tests/test_demo.py shrinks it with, and, run as a script, the demo through
its command line with them (a child process that a test can interrupt as a terminal's Ctrl-C does).

    python demo_child.py DEMO-OPTIONS...    # mem demo DEMO-OPTIONS..., at toy size
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from app import demo
from mem_core.datasets import sim as sim_dataset

TINY_STAGES = {
    "tokenizer": ["epochs=3", "batch_size=16", "model.temperature_anneal_steps=10"],
    "pretrain": ["epochs=1", "batch_size=16", "warmup_steps=1"],
    "finetune": ["epochs=2", "batch_size=5", "warmup_epochs=0", "eval_every=1", "input.randaug_ops=0"],
}


def shrink(setattr: Callable[[Any, str, Any], None]) -> None:
    """Toy stages, a 3 s corpus, 4 s live, 10 / 4 / 6 samples per class in the train / val / test splits."""
    setattr(demo, "STAGE_SETTINGS", TINY_STAGES)
    setattr(demo, "CORPUS_SIM_SECONDS", 3)
    setattr(demo, "LIVE_SECONDS", 4)
    setattr(sim_dataset, "SIM_SPLITS", {"train": (10, 1), "val": (4, 2), "test": (6, 3)})


if __name__ == "__main__":
    from app.cli import main

    shrink(setattr)
    sys.argv = ["mem", "demo", *sys.argv[1:]]
    main()
