"""The API's routers, one per area."""
