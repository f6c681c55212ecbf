"""The vLLM layer: flag catalogs per version, the memory planner, wheelhouses for offline installs."""
