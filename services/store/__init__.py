"""The task store: every ops task, step, transition and audit entry in a SQL database.

Built from the TaskEvents on `ops.task-events.v1` by the recorder (the "store" service);
read by the API through `services.store.queries`. SQLite by default, PostgreSQL in production.
"""
