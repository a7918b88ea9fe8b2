"""One router per resource of the v1 contract: events (ingest), scores (score and
rank), nodes (state summaries), classify (node-state probabilities), admin (model info and reload), health."""

from . import admin, classify, events, health, nodes, scores

ALL = (
    events.router,
    scores.router,
    nodes.router,
    classify.router,
    admin.router,
    health.router,
)
