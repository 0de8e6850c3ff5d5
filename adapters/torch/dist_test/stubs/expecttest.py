"""Minimal stand-in for the PyPI module `expecttest`, which Debian does not ship.

torch.testing._internal.common_utils imports it only to derive its TestCase
from expecttest.TestCase and to read/write the ACCEPT flag; distributed_test.py
never calls an expect-inline assertion. This stub is put on sys.path by
run_distributed_test.py only when the real module is missing.
"""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):
        # No test in distributed_test.py uses this; fail loudly rather than
        # pretend an inline expectation was checked.
        raise NotImplementedError(
            "expecttest stub: assertExpectedInline is not available")

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):
        raise NotImplementedError(
            "expecttest stub: assertExpectedRaisesInline is not available")
