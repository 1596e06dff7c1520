"""Benchmarks of futoin-evt beside the official FutoIn reference server. Run ``python -m bench``."""
