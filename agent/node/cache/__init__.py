"""The model cache (``ModelCache``) and its parts; what the rest of the node imports."""

from agent.node.cache.entry import Entry
from agent.node.cache.lifecycle import State
from agent.node.cache.modelcache import (CacheBusy, CacheError, LoadFailed, ModelCache,
                                         ModelInUse, ModelInvalid, ModelTooLarge, NotListed,
                                         Reloading, UnknownModel)

__all__ = ["CacheBusy", "CacheError", "Entry", "LoadFailed", "ModelCache", "ModelInUse",
           "ModelInvalid", "ModelTooLarge", "NotListed", "Reloading", "State", "UnknownModel"]
