"""Experiments built on the library: the LR range test, the schedule preview, benchmarks and sweeps, and the
DCGAN of `hasten gan` (gan, gan_recipe, gan_report, frechet)."""
