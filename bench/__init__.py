"""The crawler's benchmark: ``python -m bench [--quick] [--repeat N]``.

Every figure of issue 5 (and the seed-pickup latency of issue 4), ours
against a baseline in the same run, against servers it starts itself;
writes ``BENCHMARKS.md`` and prints a JSON summary.
"""
