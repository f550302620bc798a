"""The long-running processes of a run: the actor (``actor``), the preprocessor (``preprocessor``),
the trainer (``trainer``) and its policy step (``policy_step``); the actor's engines in ``engines/``."""
