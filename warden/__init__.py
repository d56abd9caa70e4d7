"""`warden`, the operator's tools: the command line, the process launcher and the demo."""
