"""The model cache (``ModelCache``, ``agent.node.cache.modelcache``) and its parts; what
the rest of the node imports. Only this package writes an entry's fields."""

from agent.node.cache.entry import Entry
from agent.node.cache.errors import (CacheBusy, CacheError, LoadFailed, ModelInUse,
                                     ModelInvalid, ModelTooLarge, NotListed, Reloading,
                                     UnknownModel)
from agent.node.cache.lifecycle import State
from agent.node.cache.modelcache import CacheListener, ModelCache

__all__ = ["CacheBusy", "CacheError", "CacheListener", "Entry", "LoadFailed", "ModelCache",
           "ModelInUse", "ModelInvalid", "ModelTooLarge", "NotListed", "Reloading", "State",
           "UnknownModel"]
