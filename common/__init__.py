"""What the agent and the services share: settings, the broker plumbing and its dead letters,
command signing, errors, telemetry and the clock. Nothing here knows a service."""
