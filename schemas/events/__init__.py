"""Versioned event models."""
