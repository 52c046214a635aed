"""``python -m bench``: run the benchmark (see :mod:`bench.run`)."""

from bench.run import main

raise SystemExit(main())
