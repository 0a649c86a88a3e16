"""Language-model API server on Ray Serve: decisions, next-edit, FIM and chat."""

__version__ = "0.1.0"
