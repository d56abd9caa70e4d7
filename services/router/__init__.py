"""The router: chooses the model (version and node) of each ML task from live statistics."""
