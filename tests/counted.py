"""A check for tests that train too briefly to assert a level of accuracy: the accuracy a run reports is a count
of correct predictions over the test set it names, and the last point of its accuracy curve."""

from __future__ import annotations

from typing import Any


def assert_counted(summary: dict[str, Any]) -> None:
    """`summary`'s test accuracy is k / n for a whole k, n the test images it says it evaluated, and the value its
    accuracy curve ends with: a number that was measured, not one that merely lies between 0 and 1."""
    images = summary["dataset"]["test_size"]
    correct = summary["test_accuracy"] * images
    assert images > 0 and abs(correct - round(correct)) < 1e-6 * images, (summary["test_accuracy"], images)
    assert summary["accuracy_curve"][-1][2] == round(summary["test_accuracy"], 6)
