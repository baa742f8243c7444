"""Ray workers: device actors with crash-isolated benchmark children, and compile tasks."""
