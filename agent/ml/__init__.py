"""Real ML jobs the agent runs as child processes (`python -m agent.ml.<module>`)."""
