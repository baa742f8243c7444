"""Launch-parameter sweeps: spec -> queue -> serve -> runner (strategies) -> trials -> export."""
