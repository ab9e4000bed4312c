"""``python -m autotune`` is the ``autotune`` command."""

from autotune.cli.app import main

main()
