"""dygserve loadtests package."""
