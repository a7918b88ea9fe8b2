"""The causal streaming DyG-Mamba model: encoders, SSM layer, node state, checkpoints, data."""
