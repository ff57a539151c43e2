"""Benchmarks: scheduler overhead, the live A/B harness and the simulator."""
