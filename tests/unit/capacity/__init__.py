"""Unit tests of the capacity providers."""
