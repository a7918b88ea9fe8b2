"""The ONNX backend: export (``export``), the shared manifest (``manifest``), the
onnxruntime drop-in for the torch model (``runtime``), the timing bench (``bench``)
and the ``dygserve export-onnx`` command (``cli``)."""
