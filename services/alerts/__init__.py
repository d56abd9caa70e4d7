"""The alerts service: keeps each alert's state in the task store and delivers it to people
through Prometheus Alertmanager and to other tools through webhooks."""
