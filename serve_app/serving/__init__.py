"""Endpoint handlers between the wire models and the engine (vLLM's ``serving_*`` layer).

Each service turns one validated request into engine calls and a wire response. They know
nothing of HTTP or Ray: the model deployments own one each, and tests drive them directly.
"""
