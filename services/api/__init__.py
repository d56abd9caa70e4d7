"""The operators' HTTP API: task records, interventions, templates, nodes, audit, console."""
