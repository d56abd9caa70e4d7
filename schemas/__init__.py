"""The ClusterWarden contract: topic names and strict event models. Imports pydantic only."""
