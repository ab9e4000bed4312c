"""``python -m benchmarks.search``: the search benchmark's command line."""

from benchmarks.search.cli import main

raise SystemExit(main())
