"""Parallelism planning for DeepSeek-V4 training: pipeline layouts and the schedules they run."""
