"""hasten's benchmarks: declarations of what to measure (each module's docstring says what and how to run it)."""
