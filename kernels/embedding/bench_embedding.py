"""Benchmark cases for embedding (see the lead's driver: benchmark_cases(device) -> list[dict]).

"embedding" times the unchecked call (check=False: no host sync, the hot path); the
"embedding[checked]" case times the default, which syncs the stream to read the error flag.
"""

from __future__ import annotations

import torch

from mllm_kernel.kernels.embedding.embedding import embedding


def _case(device, tokens, vocab, hidden, dtype, check=False):
    table = torch.randn(vocab, hidden, device=device, dtype=dtype)
    ids = torch.randint(0, vocab, (tokens,), device=device)

    def ours():
        return embedding(ids, table, check=check)

    def eager():
        return torch.nn.functional.embedding(ids, table)

    return {
        "op": "embedding[checked]" if check else "embedding",
        "shape": f"T={tokens} vocab={vocab} hidden={hidden}",
        "dtype": str(dtype).removeprefix("torch."),
        "ours": ours,
        "eager": eager,
        "bytes": 2 * tokens * hidden * table.element_size() + tokens * ids.element_size(),
    }


def benchmark_cases(device: str) -> list[dict]:
    if device == "cuda":
        token_counts, vocab = (1, 256, 4096, 32768), 128256
    else:
        token_counts, vocab = (1, 64, 1024), 32000
    cases = [_case(device, tokens, vocab, 4096, torch.bfloat16) for tokens in token_counts]
    large = token_counts[-1]
    cases.append(_case(device, large, vocab, 4096, torch.float32))
    cases.append(_case(device, large, 151936, 3584 if device == "cuda" else 896, torch.float16))
    cases.append(_case(device, token_counts[1], vocab, 4096, torch.bfloat16, check=True))
    return cases
