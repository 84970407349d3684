"""GPU benchmarks: one script per op on a common harness (benchmarks/harness.py)."""
