"""Prefect flows and deployments: ``rl-run``, ``rl-role``, ``compare`` and ``sweep``, the placement
of stages on work pools, and the local stack."""
