"""ClusterWarden's control-plane services."""
