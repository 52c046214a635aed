"""Development and demo machinery, kept out of the deployed crawler.

Nothing in :mod:`crawler` imports this package, and the egg that scrapyd
deploys to every node (``deploy/cluster.py``) carries :mod:`crawler` alone.

* :mod:`devtools.embedded`: real ``redis-server`` and SecantusDB (a MongoDB
  wire-protocol server) processes on free ports, for the demo, the tests and
  the benchmarks;
* :mod:`devtools.replay`: serves a WARC capture (or a generated site) over
  HTTP on 127.0.0.1 (``python -m devtools.replay``);
* :mod:`devtools.demo`: the main job behind ``make demo``
  (``python -m devtools.demo``).
"""
