"""One router per resource of the v1 contract: events (ingest), scores (score and
rank), nodes (state summaries), admin (model info and reload), health."""

from . import admin, events, health, nodes, scores

ALL = (events.router, scores.router, nodes.router, admin.router, health.router)
