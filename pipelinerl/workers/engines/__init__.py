"""The actor's inference engines: the protocol they share (``protocol``), transformers' continuous
batching (``transformers_engine``), vLLM and its worker extension (``vllm_engine``,
``vllm_extension``), and the float32 LM head (``lm_head``)."""
