"""hasten's tests, a package mirroring hasten's: tests/<package>/test_<module>.py tests hasten/<package>/<module>.py.
Shared helpers are imported by their package name (`from tests.resuming import resume_into`)."""
