"""A node's attributes as a plain ``dict``, for code that reads them on every node.

NOTE: onnx-ir keeps a node's attributes in a ``collections.UserDict``, whose ``get`` and
``values`` run in Python (~0.6 us a lookup against ~0.05 us for a dict's); over the few
lookups per node that annotation and the ``c`` backend's checks make, that was a tenth of a
100k-node ``inspect``.  A UserDict's own dict is its documented ``data`` attribute; a
mapping without one is returned as it is.

>>> import onnx_ir as ir
>>> node = ir.node("Relu", [], attributes={"alpha": 0.5})
>>> attributes_of(node)["alpha"].as_float()
0.5
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx_ir as ir


def attributes_of(node: ir.Node) -> Mapping[str, ir.Attr]:
    """``node.attributes``, read only: a plain dict where onnx-ir keeps one."""
    attributes = node.attributes
    data = getattr(attributes, "data", None)
    return data if type(data) is dict else attributes
