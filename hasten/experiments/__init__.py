"""Experiments built on the library: the LR range test, the schedule preview, benchmarks and sweeps, and the
DCGAN of `hasten gan` (gan, gan_report, frechet; its recipe is hasten/recipe/gan.py)."""
