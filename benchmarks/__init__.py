"""leasekeeper's benchmark suite: ``python -m benchmarks.run [--quick] [--only NAME ...]``.

Every measure runs leasekeeper and the baseline designs (``benchmarks.baselines``)
in the same run, against ``MemoryQueue`` behind ``benchmarks.latency.LatencyBackend``,
and ``benchmarks.run`` writes ``benchmarks/results/latest.{json,md}``.
See ``benchmarks/README.md`` and ``docs/performance.md``.
"""
