"""Model runtimes behind one loader interface (see ``agent.backends.base``)."""

from agent.backends.base import (Backend, BackendError, BackendUnavailable, InvalidInput,
                                 TensorSpec, make_backend)

__all__ = ["Backend", "BackendError", "BackendUnavailable", "InvalidInput", "TensorSpec",
           "make_backend"]
