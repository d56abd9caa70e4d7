"""Unit tests of the executor."""
