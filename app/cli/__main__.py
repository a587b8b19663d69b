"""``python -m app.cli``: the ``mem`` command (used by ``torchrun ... -m app.cli``)."""

from app.cli import main

main()
