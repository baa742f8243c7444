"""Parallelism planning for DeepSeek-V4 training: pipeline layouts and their validation."""
