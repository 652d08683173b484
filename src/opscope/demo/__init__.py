"""Small bundled models and a training loop: the demo, the tests and the benchmarks use them."""
