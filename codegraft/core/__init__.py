"""What every stage shares: dtype mapping, node facts, the GC pause, CompileOptions.

In: nothing of codegraft (only onnx-ir and numpy).  Out: small helpers and plain data that
any stage may import; since nothing here imports the rest of the package, no import cycle can
start here.
"""
