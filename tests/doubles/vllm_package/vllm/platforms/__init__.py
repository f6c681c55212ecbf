"""TEST DOUBLE of vllm.platforms: the platform vLLM resolves (the stand-in has no use for it)."""

current_platform = None
