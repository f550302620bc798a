"""PipelineRL: pipelined, on-policy RL of language models with in-flight weight updates, and the
conventional baseline on the same code path (Piché et al. 2025, arXiv 2509.19128)."""
