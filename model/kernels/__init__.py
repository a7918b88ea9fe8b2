"""mamba-ssm's fused kernels for this model's recurrence, their CPU twin, and the
dispatch between them and torch's rank-major path (``dispatch.kernel_advancer``)."""
