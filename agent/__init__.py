"""The node agent: reports GPU and host health, and executes verified, signed commands."""
