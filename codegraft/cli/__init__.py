"""The ``codegraft`` command: compile, run, inspect, backends, bench.

In: command-line arguments.  Out: files (``.cgx``, ONNX, SVG/HTML, JSON) and tables on the
terminal; codegraft's own errors become one line and exit code 2, never a stack trace.  It
calls the public facade and the report stage; nothing imports it.
"""
