"""A small reference engine: Llama / Qwen2 decoders served by mllm-kernel alone (every non-GEMM op
is ours; the GEMMs are torch's), with continuous batching over a paged KV cache.

    from mllm_kernel.engine import Engine
    engine = Engine.from_pretrained("/path/to/hf-folder")       # config.json + *.safetensors
    engine = Engine.from_config(transformers_config, seed=0)    # seeded random weights
    tokens = engine.generate([[1, 2, 3], [4, 5]], max_new_tokens=32, temperature=0.7, top_p=0.9)

Files, in the order a step runs them: engine.py (requests, scheduling, CUDA graphs, sampling),
model.py (the forward pass), paged_cache.py (page allocation), weights.py (Hugging Face names,
safetensors), config.py (which configs are supported).
"""

from .config import ModelConfig
from .engine import Engine

__all__ = ["Engine", "ModelConfig"]
