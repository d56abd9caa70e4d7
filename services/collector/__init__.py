"""Collector: takes node reports in, validates them, keeps node state, detects missed heartbeats."""
