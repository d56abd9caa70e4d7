"""Capacity providers: where the centre gets nodes from and gives them back to."""
