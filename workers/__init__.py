"""Ray workers: device actors with crash-isolated benchmark children, compile tasks, and the pool's
local compile processes."""
