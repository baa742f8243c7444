"""Search spaces per kernel (YAML data) and the arch facts their constraints use."""

from search_spaces.arch_facts import ARCH_FACTS, UnknownArchError, arch_facts
from search_spaces.space import SearchSpace, SpaceError, load_space

__all__ = ["ARCH_FACTS", "SearchSpace", "SpaceError", "UnknownArchError", "arch_facts", "load_space"]
