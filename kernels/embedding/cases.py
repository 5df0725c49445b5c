"""embedding: reference, report checks and benchmark cases.

"embedding" times the unchecked call (check=False: no host sync, the hot path); the
"embedding[checked]" case times the default, which syncs the stream to read the error flag.
"""

from __future__ import annotations

import torch

from mllm_kernel.kernels.checks import FLOATS, Checks, dtype_name
from mllm_kernel.kernels.embedding import embedding


def ref_embedding(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return table.cpu()[ids.cpu().long()]


def check(c: Checks) -> None:
    for dtype in FLOATS:
        n = dtype_name(dtype)

        def emb():
            table = c.randn(300, 96, dtype=dtype)
            for ids_dtype in (torch.int64, torch.int32):
                ids = torch.randint(0, 300, (3, 5), generator=c.gen, dtype=ids_dtype).to(c.device)
                c.equal(f"embedding[{dtype_name(ids_dtype)} ids] {n}", embedding(ids, table), ref_embedding(ids, table))

        c.run(f"embedding {n}", emb)


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
