"""``python -m autotune`` is the ``autotune`` command."""

from autotune.cli import main

main()
