"""What the listings say of a model: its card, built from its config and the endpoints it
serves (``AppConfig.endpoints_of``), naming only the parameters and features those honour."""

from __future__ import annotations

from serve_app.api.apply import ApplyCompletionRequest
from serve_app.api.chat import ChatCompletionRequest
from serve_app.api.common import RequestModel
from serve_app.api.decisions import DecisionRequest
from serve_app.api.edit import EditCompletionRequest
from serve_app.api.fim import FimCompletionRequest
from serve_app.api.models import (
    Datacenter,
    EndpointModelCard,
    ModelCard,
    OpenRouterRef,
)
from serve_app.config import AppConfig, Endpoint, ModelConfig
from serve_app.models.embedded import EMBEDDED_MODELS, embedded_name

# The sampling parameters a listing may name, and the request model of each endpoint: an
# endpoint honours exactly the ones its request model has as fields (each is passed on to
# SamplingParams), so a listing never names a parameter that the endpoint would not take.
SAMPLING_PARAMETERS = (
    "temperature",
    "top_p",
    "top_k",
    "stop",
    "seed",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
)
ENDPOINT_REQUESTS: dict[Endpoint, type[RequestModel]] = {
    "chat.completions": ChatCompletionRequest,
    "edit.completions": EditCompletionRequest,
    "apply.completions": ApplyCompletionRequest,
    "fim.completions": FimCompletionRequest,
    "decisions": DecisionRequest,
}
# What chat answers can be asked for (response_format), named as the listings name features.
CHAT_FEATURES = ("json_mode", "structured_outputs")
# Listed for chat where the model's template calls tools (``ModelConfig.tool_calls``).
TOOLS_FEATURE = "tools"


def honoured_parameters(endpoint: Endpoint) -> set[str]:
    fields = ENDPOINT_REQUESTS[endpoint].model_fields
    return {name for name in SAMPLING_PARAMETERS if name in fields}


def served_card(
    config: AppConfig, model_id: str, listing: Endpoint | None = None
) -> ModelCard | EndpointModelCard:
    """``model_id``'s card as served by ``config`` (``model_card``)."""
    return model_card(config.model(model_id), config.endpoints_of(model_id), listing)


def model_card(
    model: ModelConfig, endpoints: list[Endpoint] | None = None, listing: Endpoint | None = None
) -> ModelCard | EndpointModelCard:
    """The model's card in ``GET /v1/models`` (``listing`` None: what any of its
    ``endpoints`` honours) or in one endpoint's listing (what that endpoint honours). Listings
    name what is really served: an embedded source brings its own name and description."""
    endpoints = endpoints or []
    shown = endpoints if listing is None else [listing]
    honoured = set().union(*(honoured_parameters(endpoint) for endpoint in shown))
    features = list(model.supported_features)
    if "chat.completions" in shown:
        chat = CHAT_FEATURES + ((TOOLS_FEATURE,) if model.tool_calls else ())
        features += [name for name in chat if name not in features]
    embedded = EMBEDDED_MODELS.get(embedded_name(model.source) or "")
    fields = {
        "id": model.id,
        "name": model.name or (embedded.display_name if embedded else model.id),
        "created": model.created,
        "description": model.description
        or (embedded.description if embedded else f"{model.id}, served from {model.source}."),
        "context_length": model.context_length,
        "max_output_length": model.max_output_length,
        "pricing": model.pricing,
        "supported_sampling_parameters": [
            name for name in model.supported_sampling_parameters if name in honoured
        ],
        "supported_features": features,
        "openrouter": OpenRouterRef(slug=model.openrouter_slug or model.id),
        "datacenters": [Datacenter(country_code=code) for code in model.datacenters],
    }
    if listing is None:
        return ModelCard(**fields)
    return EndpointModelCard(**fields, supported_endpoints=endpoints)
