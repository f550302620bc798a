"""Pure RL math of PipelineRL (no I/O): policy losses, advantages, ESS, token lag, behaviour
mismatch, packing and padding, one module each; import what you need from its module (``advantages``
and ``packing`` need only numpy, so the preprocessor never loads torch).

Reference: Piché et al. 2025, "PipelineRL", arXiv 2509.19128.
"""
