"""TEST DOUBLE of vllm.platforms.cpu."""


class CpuPlatform:
    device_type = "cpu"
