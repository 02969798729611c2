"""I/O: checkpoint files (atomic, pickle-free), the JSON codec of gymnasium
spaces, and model export (SavedModel, ONNX)."""
