"""Suites, quality metrics, reports and plots for `mars eval` and the benchmarks."""
