"""dygserve service package."""
