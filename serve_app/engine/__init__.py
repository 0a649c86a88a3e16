"""The engine layer: the one place where tokenizers and models are loaded and run.

Nothing in this package imports FastAPI or Ray: deployments wrap it, tests drive it directly.
"""
