"""The one benchmark harness. Every script in ``bench/`` (and ``bench/studies/``) measures through it:

- :mod:`~bench.harness.server`: spawn, wait for and stop a ``hybridrag serve`` (and ``front``, ``engine``,
  redis-server); the status of what was measured; a process tree's CPU;
- :mod:`~bench.harness.loadgen`: closed-loop and open-loop load over gRPC or HTTP (in several client processes),
  closed loops in process, level summaries and ratios against a reference;
- :mod:`~bench.harness.stats`: percentiles (one shape everywhere), ratios, timed passes, modes alternated per
  round, peak memory;
- :mod:`~bench.harness.results`: the JSON entry keyed by configuration with the machine, the time and peak memory;
  a dataset's judged queries; comma-separated options;
- :mod:`~bench.harness.pipelines`: a pipeline in process as the service opens it, ablations through the config;
- :mod:`~bench.harness.plots`: PNG plots of level summaries.

Every speed claim is a ratio against a baseline measured by the same harness in the same run.
"""

from bench.harness.results import floats, ints, machine, names, query_list, read_result, write_result
from bench.harness.stats import (
    alternate,
    measure,
    median,
    ms_since,
    peak_rss_mib,
    percentiles,
    ratio,
    timed_ms,
)

__all__ = ["alternate", "floats", "ints", "machine", "measure", "median", "ms_since", "names", "peak_rss_mib",
           "percentiles", "query_list", "ratio", "read_result", "timed_ms", "write_result"]
