"""Model listings: GET /v1/models and the per-endpoint listings (api-spec.md 2.5, 4.4-4.6)."""

from __future__ import annotations

from pydantic import Field

from serve_app.api.common import ResponseModel
from serve_app.config import Endpoint, Pricing


class OpenRouterRef(ResponseModel):
    slug: str


class Datacenter(ResponseModel):
    country_code: str


class ModelCard(ResponseModel):
    id: str
    name: str
    created: int
    description: str
    input_modalities: list[str] = Field(default_factory=lambda: ["text"])
    output_modalities: list[str] = Field(default_factory=lambda: ["text"])
    context_length: int
    max_output_length: int
    pricing: Pricing
    supported_sampling_parameters: list[str]
    supported_features: list[str]
    openrouter: OpenRouterRef
    datacenters: list[Datacenter]


class EndpointModelCard(ModelCard):
    supported_endpoints: list[Endpoint]


class ModelList(ResponseModel):
    data: list[ModelCard]


class EndpointModelList(ResponseModel):
    data: list[EndpointModelCard]
