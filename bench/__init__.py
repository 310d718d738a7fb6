"""Benchmarks (not tests): the model zoo, the peer comparison, the boundary-crossing cost."""
