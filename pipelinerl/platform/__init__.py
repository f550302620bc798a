"""The plumbing every process of a run shares: config, wire messages, ZeroMQ transport, weight
groups, checkpoints, JSON-lines records; what runs leave behind for people is in ``tracking/``."""
