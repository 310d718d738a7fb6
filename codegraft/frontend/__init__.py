"""Frontends: what a user hands to ``compile`` (a file, bytes, an ONNX or onnx-ir model, a
PyTorch module, an FX graph from ``torch.compile``) in, one ONNX model out."""
