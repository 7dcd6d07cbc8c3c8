"""hasten's version: one home, read by the package metadata, run records and cache keys."""

__version__ = "0.1.0"
