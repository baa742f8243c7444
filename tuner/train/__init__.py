"""Measured V4 training runs and per-layer profiles, queued and run over Ray."""
