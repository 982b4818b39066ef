"""sglang-sweep: overnight sweeps of NCCL and speculative-decoding settings for SGLang."""

__version__ = "0.1.0"
