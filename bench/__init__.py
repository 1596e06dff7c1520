"""Benchmarks of futoin-evt beside the official FutoIn reference server. Run ``python -m bench``."""

import os

#: Every server the benchmarks start is one process unless a benchmark asks for more
#: (``--workers``; bench.workers compares 1 and 2): the figures stay comparable across runs.
os.environ.setdefault("FUTOIN_EVT_WORKERS", "1")
