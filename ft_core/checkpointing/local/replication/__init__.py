"""Replication of each rank's local checkpoint to a rank on another node."""
