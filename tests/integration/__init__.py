"""Tests of the integration layer."""
