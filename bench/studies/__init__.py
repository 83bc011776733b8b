"""Tuning studies: scripts that choose a default (a weight, a grid point, a lever, a design) on tuning splits and
report the test split beside it, never choosing on it. Apart from the benchmarks (``bench/``), which measure what
the defaults cost against a baseline in the same run. Run each as ``python -m bench.studies.NAME`` or
``hybridrag bench NAME``; rows in bench/README.md."""
