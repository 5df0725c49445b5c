"""Engine: continuous batching over the paged KV cache, built on model.Model.

Each iteration of generate() (1) admits waiting requests while a batch slot and their pages are
free, (2) runs one prefill step over the admitted requests' prompt chunks (at most
max_prefill_tokens tokens; a longer prompt continues in the next iteration), (3) runs one decode
step for every request whose tokens are all cached, and (4) retires finished requests, freeing
their slot and pages for the next admissions. On CUDA the decode step is a CUDA graph per batch
bucket (powers of two up to max_batch), captured on first use.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os

import torch

import mllm_kernel as mk

from . import weights as W
from .config import ModelConfig
from .model import Model, StepBatch
from .paged_cache import BlockManager


@dataclasses.dataclass
class _Request:
    index: int
    prompt: list[int]
    max_new: int
    out: list[int] = dataclasses.field(default_factory=list)
    logits: list[torch.Tensor] = dataclasses.field(default_factory=list)
    blocks: list[int] = dataclasses.field(default_factory=list)
    slot: int = -1
    num_cached: int = 0  # tokens whose K/V are in the cache

    @property
    def tokens_to_cache(self) -> int:  # the last new token is never fed back
        return len(self.prompt) + self.max_new - 1


@dataclasses.dataclass(frozen=True)
class _Sampling:
    temperature: float
    top_k: int
    top_p: float
    min_p: float


class Engine:
    """A Llama / Qwen2 decoder served by mllm-kernel: build one with from_pretrained or from_config."""

    def __init__(self, config: ModelConfig, state: dict[str, torch.Tensor], *, device=None, dtype=None,
                 max_batch: int = 16, num_blocks: int | None = None, block_size: int = 16,
                 max_seq_len: int | None = None, max_prefill_tokens: int = 8192, cuda_graphs: bool = True):
        device = _device(device)
        dtype = dtype if dtype is not None else (torch.bfloat16 if device.type == "cuda" else torch.float32)
        allowed = (torch.float32, torch.float16, torch.bfloat16)
        if dtype not in allowed:
            raise ValueError(f"Engine: dtype must be one of {allowed}, got {dtype}")
        for name, value, low in (("max_batch", max_batch, 1), ("block_size", block_size, 1),
                                 ("max_prefill_tokens", max_prefill_tokens, 1)):
            if type(value) is not int or value < low:
                raise ValueError(f"Engine: {name} must be an int >= {low}, got {value!r}")
        max_seq_len = max_seq_len if max_seq_len is not None else min(config.max_position_embeddings, 8192)
        if type(max_seq_len) is not int or max_seq_len < 1:
            raise ValueError(f"Engine: max_seq_len must be an int >= 1, got {max_seq_len!r}")
        self.max_blocks_per_seq = -(-max_seq_len // block_size)
        num_blocks = num_blocks if num_blocks is not None else max_batch * self.max_blocks_per_seq
        if type(num_blocks) is not int or num_blocks < 1:
            raise ValueError(f"Engine: num_blocks must be an int >= 1, got {num_blocks!r}")

        self.config, self.device, self.dtype = config, device, dtype
        self.max_batch, self.max_seq_len, self.max_prefill_tokens = max_batch, max_seq_len, max_prefill_tokens
        self.model = Model(config, W.fuse(config, state, device, dtype), num_blocks=num_blocks,
                           block_size=block_size, max_seq_len=max_seq_len, device=device, dtype=dtype)
        self.blocks = BlockManager(num_blocks, block_size)
        # Each batch slot's pages; row max_batch stays zero for the padding rows of a decode bucket.
        self.block_table = torch.zeros(max_batch + 1, self.max_blocks_per_seq, dtype=torch.int32, device=device)
        self.cuda_graphs = cuda_graphs and device.type == "cuda"
        self.buckets = sorted({min(1 << i, max_batch) for i in range(max_batch.bit_length() + 1)})
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor, torch.Tensor]] = {}

    # ---- construction ----------------------------------------------------------------------

    @classmethod
    def from_pretrained(cls, path: str, *, device=None, dtype=None, max_batch: int = 16,
                        num_blocks: int | None = None, block_size: int = 16, **kwargs) -> "Engine":
        """A local Hugging Face model folder: config.json + *.safetensors (Llama, Qwen2)."""
        config_path = os.path.join(path, "config.json")
        if not os.path.isfile(config_path):
            raise FileNotFoundError(f"Engine.from_pretrained: no config.json in {path!r}")
        with open(config_path) as f:
            config = ModelConfig.from_hf(json.load(f))
        return cls(config, W.load_safetensors(path), device=device, dtype=dtype, max_batch=max_batch,
                   num_blocks=num_blocks, block_size=block_size, **kwargs)

    @classmethod
    def from_config(cls, config, *, seed: int = 0, **kwargs) -> "Engine":
        """Seeded random weights (weights.random_state_dict, drawn on the engine's device) for a
        config: a ModelConfig, a config.json dict or a transformers config."""
        if not isinstance(config, ModelConfig):
            config = ModelConfig.from_hf(config)
        device = _device(kwargs.pop("device", None))
        return cls(config, W.random_state_dict(config, seed, device), device=device, **kwargs)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under Hugging Face names (load them into transformers to compare)."""
        return W.unfuse(self.config, self.model.weights)

    def save_pretrained(self, path: str) -> None:
        W.save_pretrained(path, self.config, self.state_dict())

    # ---- generation ------------------------------------------------------------------------

    def generate(self, prompt_token_ids: list[list[int]], max_new_tokens, *, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, seed: int | None = None,
                 stop_token_ids=None, return_logits: bool = False):
        """The new tokens of each prompt. max_new_tokens: an int, or one per prompt. temperature 0 is
        greedy; otherwise sampling from softmax(logits / temperature) limited by top_k (0: off),
        top_p (1: off) and min_p (0: off), in that order, from a generator seeded with `seed`.
        A request stops after max_new_tokens or at a token of stop_token_ids (included).
        return_logits: also return each request's float32 logits [new tokens, vocab] (on the CPU)."""
        requests = self._requests(prompt_token_ids, max_new_tokens)
        sampling = _check_sampling(temperature, top_k, top_p, min_p)
        stop = frozenset(_check_ids("stop_token_ids", list(stop_token_ids or []), self.config.vocab_size))
        generator = None
        if seed is not None:
            if type(seed) is not int:
                raise TypeError(f"Engine.generate: seed must be None or an int, got {type(seed).__name__}")
            generator = torch.Generator(self.device).manual_seed(seed)

        waiting = collections.deque(requests)
        free_slots = list(range(self.max_batch - 1, -1, -1))
        running: list[_Request] = []
        try:
            while waiting or running:
                while waiting and free_slots:
                    blocks = self.blocks.allocate(waiting[0].tokens_to_cache)
                    if blocks is None:
                        break
                    r = waiting.popleft()
                    r.blocks, r.slot = blocks, free_slots.pop()
                    row = torch.zeros(self.max_blocks_per_seq, dtype=torch.int32)
                    row[:len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
                    self.block_table[r.slot].copy_(row)
                    running.append(r)
                prefilling = [r for r in running if r.num_cached < len(r.prompt)]
                if prefilling:
                    done, logits = self._prefill_step(prefilling)
                    self._take(done, logits, sampling, generator, return_logits)
                decoding = [r for r in running if r.out and r.num_cached == len(r.prompt) + len(r.out) - 1
                            and len(r.out) < r.max_new and r.out[-1] not in stop]
                if decoding:
                    self._take(decoding, self._decode_step(decoding), sampling, generator, return_logits)
                for r in [r for r in running if len(r.out) == r.max_new or (r.out and r.out[-1] in stop)]:
                    running.remove(r)
                    self.blocks.release(r.blocks)
                    free_slots.append(r.slot)
        finally:  # an error or interrupt mid-way must not leak pages: the engine stays usable
            for r in running:
                self.blocks.release(r.blocks)
        tokens = [r.out for r in requests]
        return (tokens, [torch.stack(r.logits) for r in requests]) if return_logits else tokens

    def _requests(self, prompts, max_new_tokens) -> list[_Request]:
        if not isinstance(prompts, (list, tuple)) or not all(isinstance(p, (list, tuple)) for p in prompts):
            raise TypeError("Engine.generate: prompt_token_ids must be a list of lists of token ids")
        counts = list(max_new_tokens) if isinstance(max_new_tokens, (list, tuple)) else [max_new_tokens] * len(prompts)
        if len(counts) != len(prompts):
            raise ValueError(f"Engine.generate: {len(counts)} max_new_tokens for {len(prompts)} prompts")
        requests = []
        for i, (prompt, n) in enumerate(zip(prompts, counts)):
            if type(n) is not int or n < 1:
                raise ValueError(f"Engine.generate: max_new_tokens must be an int >= 1, got {n!r} (prompt {i})")
            if not prompt:
                raise ValueError(f"Engine.generate: prompt {i} is empty")
            r = _Request(i, _check_ids(f"prompt_token_ids[{i}]", list(prompt), self.config.vocab_size), n)
            if r.tokens_to_cache > self.max_seq_len:
                raise ValueError(f"Engine.generate: prompt {i} ({len(prompt)} tokens) + {n} new tokens exceeds "
                                 f"max_seq_len {self.max_seq_len}")
            if self.blocks.blocks_for(r.tokens_to_cache) > self.blocks.num_blocks:
                raise ValueError(f"Engine.generate: prompt {i} needs {self.blocks.blocks_for(r.tokens_to_cache)} "
                                 f"pages, the cache has {self.blocks.num_blocks}")
            requests.append(r)
        return requests

    def _take(self, requests, logits, sampling, generator, keep_logits) -> None:
        """Sample one token per request from its logits row and append it."""
        tokens = _sample(logits, sampling, generator).tolist()
        for i, (r, t) in enumerate(zip(requests, tokens)):
            r.out.append(t)
            if keep_logits:
                r.logits.append(logits[i].cpu())

    def _prefill_step(self, requests: list[_Request]):
        """One ragged prefill over prompt chunks; returns the requests whose prompt is now all
        cached and their logits."""
        ids, positions, slots, lens, rows, cu = [], [], [], [], [], [0]
        budget, finishing = self.max_prefill_tokens, []
        bs = self.blocks.block_size
        for r in requests:
            if budget == 0:
                break
            start = r.num_cached
            n = min(len(r.prompt) - start, budget)
            budget -= n
            ids += r.prompt[start:start + n]
            positions += range(start, start + n)
            slots += [r.blocks[p // bs] * bs + p % bs for p in range(start, start + n)]
            r.num_cached += n
            lens.append(r.num_cached)
            rows.append(r.slot)
            cu.append(cu[-1] + n)
            finishing.append(r.num_cached == len(r.prompt))
        dev = self.device
        batch = StepBatch(
            ids=torch.tensor(ids, dtype=torch.int64).to(dev), positions=torch.tensor(positions).to(dev),
            slots=torch.tensor(slots, dtype=torch.int64).to(dev),
            block_table=self.block_table.index_select(0, torch.tensor(rows).to(dev)),
            seq_lens=torch.tensor(lens, dtype=torch.int32).to(dev),
            logit_rows=torch.tensor(cu[1:], dtype=torch.int64).to(dev) - 1,
            cu_seqlens_q=torch.tensor(cu, dtype=torch.int32).to(dev))
        logits = self.model.forward(batch)
        done = [i for i, f in enumerate(finishing) if f]
        return [requests[i] for i in done], logits[done]

    def _decode_step(self, requests: list[_Request]) -> torch.Tensor:
        n = len(requests)
        bucket = next(b for b in self.buckets if b >= n) if self.cuda_graphs else n
        bs, pad = self.blocks.block_size, bucket - n
        ids, positions, slots, rows = [], [], [], []
        for r in requests:
            pos = r.num_cached
            ids.append(r.out[-1])
            positions.append(pos)
            slots.append(r.blocks[pos // bs] * bs + pos % bs)
            rows.append(r.slot)
            r.num_cached += 1
        # Padding rows write no cache slot (-1) and read the all-zero block-table row.
        host = torch.tensor([ids + [0] * pad, positions + [0] * pad, slots + [-1] * pad,
                             rows + [self.max_batch] * pad], dtype=torch.int64)
        if not self.cuda_graphs:
            return self.model.forward(self._decode_batch(host.to(self.device)))[:n]
        graph, inputs, logits = self._graphs.get(bucket) or self._capture(bucket)
        inputs.copy_(host)
        graph.replay()
        return logits[:n]

    def _decode_batch(self, inputs: torch.Tensor) -> StepBatch:
        """A decode step's batch from int64 [4, bucket] = ids, positions, cache slots, batch slots."""
        return StepBatch(ids=inputs[0], positions=inputs[1], slots=inputs[2],
                         block_table=self.block_table.index_select(0, inputs[3]),
                         seq_lens=(inputs[1] + 1).to(torch.int32),
                         logit_rows=torch.arange(inputs.shape[1], device=inputs.device))

    def _capture(self, bucket: int):
        inputs = torch.zeros(4, bucket, dtype=torch.int64, device=self.device)
        inputs[2].fill_(-1)  # the warm-up runs for real: it must not write the cache
        inputs[3].fill_(self.max_batch)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):  # first calls (lazy module loads, cuBLAS handles) outside the capture
            for _ in range(2):
                self.model.forward(self._decode_batch(inputs))
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = self.model.forward(self._decode_batch(inputs))
        self._graphs[bucket] = (graph, inputs, logits)
        return self._graphs[bucket]


def _device(device) -> torch.device:
    """The engine's device: the given one, else CUDA when there is a GPU, else the CPU."""
    device = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"Engine: device must be a cpu or cuda device, got {device}")
    return device


def _sample(logits: torch.Tensor, s: _Sampling, generator) -> torch.Tensor:
    if s.temperature == 0.0:
        return mk.greedy_sample(logits)
    if s.min_p > 0.0:  # min-p needs probabilities: narrow them in the same order as the logits path
        probs = mk.softmax(logits, s.temperature)
        if s.top_k > 0:
            probs = mk.top_k_renorm_probs(probs, s.top_k)
        if s.top_p < 1.0:
            probs = mk.top_p_renorm_probs(probs, s.top_p)
        return mk.min_p_sample(probs, s.min_p, generator)
    scaled = logits if s.temperature == 1.0 else logits / s.temperature
    return mk.top_k_top_p_sample(scaled, s.top_k, s.top_p, generator)


def _check_sampling(temperature, top_k, top_p, min_p) -> _Sampling:
    def number(name, value, ok, expected):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(float(value)):
            raise ValueError(f"Engine.generate: {name} must be {expected}, got {value!r}")
        return float(value)

    t = number("temperature", temperature, lambda v: 0.0 <= v < math.inf, "a finite number >= 0")
    if type(top_k) is not int or top_k < 0:
        raise ValueError(f"Engine.generate: top_k must be an int >= 0 (0: off), got {top_k!r}")
    p = number("top_p", top_p, lambda v: 0.0 < v <= 1.0, "in (0, 1]")
    m = number("min_p", min_p, lambda v: 0.0 <= v <= 1.0, "in [0, 1]")
    return _Sampling(t, top_k, p, m)


def _check_ids(name: str, ids: list, vocab: int) -> list[int]:
    for i in ids:
        if type(i) is not int or not 0 <= i < vocab:
            raise ValueError(f"Engine.generate: {name} holds {i!r}; token ids must be ints in [0, {vocab})")
    return ids
