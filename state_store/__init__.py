"""dygserve state_store package."""
