"""An endpoint's role in an event: each event (u, v) is one entry for u as its source
and one for v as its destination."""

ROLE_SRC, ROLE_DST = 0, 1
