"""Benchmarks. Run each from the repository root as a module: ``.venv/bin/python -m bench.protocol``."""
