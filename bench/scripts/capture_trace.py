"""Records PyTorch's allocator trace of a few training steps of a GPT-style model, for `vfabric-bench trace`.

    python3 capture_trace.py --out trace.json [--layers 8 --dim 2048 --seq 1024 --batch 4 --steps 3]

Recording starts before the first allocation, so the trace holds every block of the run. What is written:
{"events": [[action, addr, size], ...], "torch": {...}}: the allocator's actions on device 0 in order (`alloc`,
`free_requested`, `free_completed`, `segment_alloc`, `segment_free`, `segment_map`, `segment_unmap`), and
torch's own peak figures for the run. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to record that
allocator instead.
"""

import argparse
import json
import os
import time

import torch
import torch.nn as nn


class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class Gpt(nn.Module):
    def __init__(self, vocab: int, d: int, layers: int, heads: int):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        n = tokens.shape[1]
        mask = torch.triu(torch.full((n, n), float("-inf"), device=tokens.device, dtype=torch.bfloat16), 1)
        x = self.emb(tokens)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--dim", type=int, default=2048)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    torch.cuda.memory._record_memory_history(max_entries=2_000_000)
    model = Gpt(a.vocab, a.dim, a.layers, a.heads).cuda().to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    t = time.time()
    for step in range(a.steps):
        tokens = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda")
        logits = model(tokens[:, :-1])
        loss = nn.functional.cross_entropy(logits.float().reshape(-1, a.vocab), tokens[:, 1:].reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        print(f"step {step}: loss {loss.item():.4f}", flush=True)
    torch.cuda.synchronize()
    snap = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    keep = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "segment_map", "segment_unmap"}
    events = [[e["action"], e["addr"], e["size"]] for e in snap["device_traces"][0] if e["action"] in keep]
    params = sum(x.numel() for x in model.parameters())
    doc = {
        "events": events,
        "torch": {
            "version": torch.__version__,
            "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
            "max_memory_allocated": torch.cuda.max_memory_allocated(),
            "max_memory_reserved": torch.cuda.max_memory_reserved(),
            "model": f"GPT-style, {a.layers} layers, d={a.dim}, vocab {a.vocab}, seq {a.seq}, batch {a.batch}, "
            f"{params / 1e9:.2f} B parameters, bf16, AdamW, {a.steps} steps",
            "seconds": time.time() - t,
        },
    }
    with open(a.out, "w") as f:
        json.dump(doc, f)
    print(f"{len(events)} events, peak allocated {doc['torch']['max_memory_allocated'] / 2**30:.2f} GiB, "
          f"peak reserved {doc['torch']['max_memory_reserved'] / 2**30:.2f} GiB -> {a.out}")


if __name__ == "__main__":
    main()
