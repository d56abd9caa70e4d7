"""Tuner: keeps tunable templates in step with the capacity nodes are measured to deliver."""
