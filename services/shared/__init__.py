"""Boring plumbing shared by every service: settings, broker, dead letters, telemetry, Redis."""
