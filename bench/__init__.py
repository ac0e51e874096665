"""Benchmarks: each module prints its figures and, last, one JSON line.

Run them from the repository root as modules, `.venv/bin/python -m bench.NAME [options]`:
the root is then first on the import path, so the repository's packages import with or
without the editable install (the GPU machine's Python has none), helpers shared by
benchmarks are `bench.NAME`, and no benchmark has to edit `sys.path`.
"""
