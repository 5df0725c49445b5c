"""embedding against torch indexing (kernels/embedding)."""

from __future__ import annotations

import zlib

import pytest
import torch

from mllm_kernel.kernels.embedding import embedding, pop_embedding_error

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
ID_DTYPES = [torch.int32, torch.int64]
HAS_CUDA = torch.cuda.is_available()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason="needs CUDA")

# (ids shape, vocab, hidden)
SHAPES = [
    ((1,), 1, 1),
    ((3,), 10, 17),
    ((2, 17), 127, 64),
    ((127,), 1000, 3),  # 3-element rows: only 2/4-byte copy units
    ((4, 5, 50), 4099, 129),
    ((4099,), 32000, 1024),  # large
]


def seed(*parts) -> None:
    """A per-test seed that does not depend on PYTHONHASHSEED."""
    torch.manual_seed(zlib.crc32(repr(parts).encode()))


def run_case(shape, dtype, id_dtype, device, table_row_pad=0, offset=0):
    ids_shape, vocab, hidden = shape
    flat = torch.randn(vocab * (hidden + table_row_pad) + offset, device=device).to(dtype)
    table = flat[offset:].view(vocab, hidden + table_row_pad)[:, :hidden]  # maybe row-strided
    ids = torch.randint(0, vocab, ids_shape, device=device, dtype=id_dtype)
    out = embedding(ids, table)
    assert out.shape == (*ids_shape, hidden) and out.dtype == dtype and out.device == table.device
    assert torch.equal(out, table[ids.long()]), "a gather must be bit-exact"


# ----------------------------------------------------------------------------- CPU


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_reference(shape, dtype, id_dtype):
    seed(shape, dtype, id_dtype)
    run_case(shape, dtype, id_dtype, "cpu")


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_strided_table_and_offset(dtype):
    seed(dtype)
    run_case(((33,), 100, 64), dtype, torch.int64, "cpu", table_row_pad=8)
    run_case(((9,), 7, 5), dtype, torch.int32, "cpu", table_row_pad=1, offset=1)


def test_cpu_empty():
    out = embedding(torch.zeros(0, 3, dtype=torch.int64), torch.randn(4, 8))
    assert out.shape == (0, 3, 8)


@pytest.mark.parametrize("bad", [-1, 10, 2**40])
def test_cpu_out_of_range_id(bad):
    ids = torch.tensor([[0, 3], [bad, 9]])
    with pytest.raises(ValueError, match=rf"\[2\] = {bad}"):
        embedding(ids, torch.randn(10, 4))


def test_cpu_bad_inputs():
    table = torch.randn(10, 8)
    with pytest.raises(TypeError):
        embedding(torch.tensor([1.0]), table)  # float ids
    with pytest.raises(TypeError):
        embedding(torch.tensor([1], dtype=torch.int16), table)
    with pytest.raises(TypeError):
        embedding(torch.tensor([1]), table.double())
    with pytest.raises(ValueError):
        embedding(torch.tensor([1]), torch.randn(10))  # 1-D table
    with pytest.raises(ValueError):
        embedding(torch.tensor([1]), torch.randn(8, 10).t())  # hidden not contiguous
    with pytest.raises(ValueError):
        embedding(torch.arange(8).view(2, 4).t(), table)  # non-contiguous ids


def test_cpu_torch_compile():
    seed("compile")
    table = torch.randn(50, 24)
    ids = torch.randint(0, 50, (3, 7))

    def fn(ids, table):
        return embedding(ids, table) * 2

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(ids, table), fn(ids, table))


# ----------------------------------------------------------------------------- CUDA


@cuda_only
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("id_dtype", ID_DTYPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_reference(shape, dtype, id_dtype):
    seed(shape, dtype, id_dtype)
    run_case(shape, dtype, id_dtype, "cuda")


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_strided_and_unaligned(dtype):
    seed(dtype)
    run_case(((33,), 100, 64), dtype, torch.int64, "cuda", table_row_pad=8)
    run_case(((65,), 100, 256), dtype, torch.int64, "cuda", offset=1)  # unaligned: narrow units
    run_case(((9,), 7, 5), dtype, torch.int32, "cuda", table_row_pad=1, offset=1)


@cuda_only
@pytest.mark.parametrize("dtype", DTYPES)
def test_cuda_matches_cpu(dtype):
    seed("agree", dtype)
    table = torch.randn(300, 96).to(dtype)
    ids = torch.randint(0, 300, (5, 40))
    assert torch.equal(embedding(ids.cuda(), table.cuda()).cpu(), embedding(ids, table))


@cuda_only
def test_cuda_out_of_range_id():
    table = torch.randn(10, 4, device="cuda")
    pop_embedding_error()  # start clean
    with pytest.raises(ValueError, match=r"\[2\] = 10"):
        embedding(torch.tensor([[0, 3], [10, 9]], device="cuda"), table)  # checks by default
    # check=False: no sync, the bad row is zero-filled and the record waits.
    out = embedding(torch.tensor([1, -3, 2], device="cuda"), table, check=False)
    assert torch.equal(out[1], torch.zeros(4, device="cuda"))
    assert torch.equal(out[[0, 2]], table[[1, 2]])
    assert pop_embedding_error() == (1, -3)
    assert pop_embedding_error() is None


@cuda_only
def test_cuda_bad_device():
    with pytest.raises(ValueError):
        embedding(torch.tensor([0, 1]), torch.randn(10, 4, device="cuda"))  # ids on CPU


@cuda_only
def test_cuda_graph():
    seed("graph")
    table = torch.randn(1000, 256, device="cuda", dtype=torch.bfloat16)
    ids = torch.randint(0, 1000, (31,), device="cuda")
    embedding(ids, table)  # warm-up: module + flag buffer
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = embedding(ids, table)  # the default check is skipped while capturing
    for _ in range(2):
        ids.copy_(torch.randint(0, 1000, (31,), device="cuda"))
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, table[ids])


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-v"]))
