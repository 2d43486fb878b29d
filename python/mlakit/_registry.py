"""Live objects by integer id. torch custom ops take tensors and scalars only, not Python objects
or C handles, so torch.ops.mlakit names layers and workspaces by these ids (docs/python.md)."""

import itertools
import threading
import weakref


class Registry:
    """Weak map id -> object: an id stops resolving once its object is collected, so a stale id
    raises ValueError instead of reaching freed C memory."""

    def __init__(self, kind, id_name):
        self._kind = kind  # the class name, in messages
        self._id_name = id_name  # the attribute that holds the id, in messages
        self._objects = weakref.WeakValueDictionary()
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def add(self, obj):
        """Registers obj and returns its new id."""
        with self._lock:
            new_id = next(self._ids)
        self._objects[new_id] = obj
        return new_id

    def get(self, obj_id):
        obj = self._objects.get(obj_id)
        if obj is None:
            raise ValueError(f"mlakit: no live {self._kind} with {self._id_name} {obj_id}")
        return obj
