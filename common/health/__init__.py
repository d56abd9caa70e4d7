"""The health endpoints of every ClusterWarden process: `/livez` (restarting it would help) and
`/readyz` (it has started and its dependencies answer). `policy` decides, `http` parses and
renders a request, `server` serves them in the service's own event loop, `checks` asks the
dependencies (docs/helm.md, "Probes")."""
