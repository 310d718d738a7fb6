"""Names the stages agree on without importing each other.

``CONTROL_BACKEND`` is the backend name a partition of If/Loop nodes carries from planning
through the artifact to the runtime (it is stored in ``.cgx`` files: do not change it).
"""

CONTROL_BACKEND = "codegraft.control"
CONTROL_OPS = frozenset({"If", "Loop"})

__all__ = ["CONTROL_BACKEND", "CONTROL_OPS"]
