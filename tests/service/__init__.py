"""One part of ClusterWarden against a real redis-server, Kafka broker or PostgreSQL."""
