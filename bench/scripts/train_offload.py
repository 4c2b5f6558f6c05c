#!/usr/bin/env python3
"""The training benchmark: one GPT-style decoder, five ways of holding its state, run one per invocation
(bench/scripts/train_bench.sh runs them all on one machine and writes the table and the plot).

  resident : fp32 params + fp32 grads + AdamW(fused) states on the GPU, bf16 autocast compute (upper bound).
  fsdp     : FSDP2 fully_shard (world size 1) with CPUOffloadPolicy(pin_memory=True): fp32 params, grads and
             Adam states on the CPU, AdamW step on the CPU; bf16 compute via MixedPrecisionPolicy
             (param_dtype=bf16, reduce_dtype=fp32) + the same autocast.
  stream   : hand-written layer streaming.  Per layer, pinned host memory holds bf16 weights, bf16 grads,
             fp32 master weights and fp32 Adam m/v (exactly sized buffers, cudaHostRegister).  Two GPU weight
             slots; a side stream copies layer i+1 (forward) / i-1 (backward) while layer i computes
             (events order slot reuse).  --act keep: each layer's autograd graph is kept on the GPU and the
             weight tensors it saved are swapped for the re-fetched slot by saved_tensors_hooks;
             --act recompute: forward under no_grad keeps only layer inputs, backward recomputes the layer.
             Layer grads (bf16) go GPU -> pinned host on a second stream.  --opt gpu: AdamW streamed layer by
             layer (fp32 master+m+v+bf16 grad in, fused AdamW on the GPU, fp32 master+m+v+bf16 weights out,
             double-buffered); --opt cpu: torch fused AdamW on the CPU over the pinned buffers.
             Embedding (tied head) and final LayerNorm stay resident on the GPU with a GPU AdamW.
  vfabric  : vfabric.torch.stream(): each block's fp32 master weights, Adam moments and bf16 compute copy in
             fabric regions of an embedded fabric whose GPU budget is --fabric-budget (host memory below it),
             streamed through the GPU by the fabric's own prefetch and write-back; AdamW per block on the GPU right
             after its backward; only block inputs kept (backward recomputes).  Embedding/head resident as above.
  allocator: the resident loop unchanged, every CUDA tensor allocated by the fabric
             (vfabric.torch.use_as_allocator(budget=--allocator-budget)).
--accum N (resident, vfabric, allocator): N micro-batches of --batch each per optimizer step (loss / N each).

Data parallel: started by torchrun or mpirun (one rank a GPU; bench/scripts/train_ranks.py), resident is DDP, fsdp
shards over the ranks (CPU offload as above), and vfabric streams each rank's blocks through the fabric of the
node's agent (vfabric.connect(): local rank 0 starts it), each block's gradients averaged across the ranks before
its AdamW step. Each rank trains on its own batch; the losses are the ranks' mean, the tokens all ranks'.

Data: one fixed batch of random tokens, reused every step, so the loss visibly falls (memorisation).
Same seeds => same initial weights in every mode; compare the loss columns across modes.
Output: human-readable lines and one 'RESULT {json}' line (also appended to --json).
"""
import argparse, contextlib, json, math, os, statistics, sys, time

import torch
import torch.nn as nn
import torch.nn.functional as F

from train_ranks import Ranks

CUDA = torch.cuda.is_available()
DEV = torch.device("cuda" if CUDA else "cpu")
BF16, FP32 = torch.bfloat16, torch.float32
RANKS = Ranks()


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["resident", "fsdp", "stream", "vfabric", "allocator"])
    p.add_argument("--accum", type=int, default=1, help="micro-batches per step (resident, vfabric, allocator)")
    p.add_argument("--fabric-budget", default="10GiB", help="vfabric: the fabric's GPU arena")
    p.add_argument("--lookahead", type=int, default=2, help="vfabric: blocks prefetched ahead")
    p.add_argument("--host-chunk", type=int, default=0,
                   help="vfabric: parameters of a CPU-stepped block whose AdamW and compute copy run together (0: whole block)")
    p.add_argument("--host-layers", default="0",
                   help="vfabric: last blocks whose AdamW runs on the CPU, or `auto` (half of them to start; the stream "
                        "then chooses step by step from what each step measured)")
    p.add_argument("--host-threads", type=int, default=0,
                   help="vfabric: PyTorch's intra-op threads for the whole process, the CPU's steps among them "
                        "(torch.set_num_threads; 0: PyTorch's default, one a core)")
    p.add_argument("--schedule", choices=["micro", "blocks"], default="micro",
                   help="vfabric with --accum: micro-batch by micro-batch (the unchanged loop), or block by block "
                        "(StreamedLayers.step_by_blocks: each group of micro-batches through a block before the next)")
    p.add_argument("--group", type=int, default=0, help="vfabric --schedule blocks: micro-batches a group (0: all)")
    p.add_argument("--allocator-budget", default="120GiB", help="allocator: the fabric's GPU arena")
    p.add_argument("--layers", type=int, default=2)
    # --dim under torchrun, whose own options take --d for an abbreviation of theirs.
    p.add_argument("--d", "--dim", dest="d", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=10, help="total steps, warm-up included")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--wd", type=float, default=0.1)
    p.add_argument("--act", choices=["keep", "recompute"], default="keep", help="stream mode activations")
    p.add_argument("--opt", choices=["gpu", "cpu"], default="gpu", help="stream mode optimizer placement")
    p.add_argument("--fsdp-opt", choices=["fused", "foreach"], default="fused", help="CPU AdamW flavour in fsdp")
    p.add_argument("--dump-tensors", default="", help="resident: after the run, write a block's tensors (bf16 "
                   "weights, fp32 master weights, Adam moments, gradients, bf16 activations) as raw files here, "
                   "for vfabric-bench storage --tensors")
    p.add_argument("--tag", default="")
    p.add_argument("--json", default="")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--watchdog", type=float, default=0,
                   help="seconds a step may take before every thread's Python stack goes to stderr (again each time; 0: never)")
    p.add_argument("--port", type=int, default=29517, help="data parallel under mpirun: rank 0's port (127.0.0.1)")
    a = p.parse_args()
    a.auto_host = a.host_layers == "auto"
    a.host_layers = a.layers // 2 if a.auto_host else int(a.host_layers)
    return a


# ----------------------------------------------------------------------------------------------- model
def param_spec(d):
    return [("qkv", (3 * d, d)), ("proj", (d, d)), ("fc1", (4 * d, d)), ("fc2", (d, 4 * d)),
            ("ln1_w", (d,)), ("ln1_b", (d,)), ("ln2_w", (d,)), ("ln2_b", (d,))]


def block_fn(x, w, heads):
    """Pre-LN GPT block; x is the fp32 residual stream, w maps names to weight tensors."""
    B, S, D = x.shape
    h = F.layer_norm(x, (D,), w["ln1_w"].to(x.dtype), w["ln1_b"].to(x.dtype))  # LN in fp32, like CUDA autocast
    qkv = F.linear(h, w["qkv"])
    q, k, v = qkv.view(B, S, 3, heads, D // heads).permute(2, 0, 3, 1, 4).unbind(0)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    x = x + F.linear(a.transpose(1, 2).reshape(B, S, D), w["proj"])
    h = F.layer_norm(x, (D,), w["ln2_w"].to(x.dtype), w["ln2_b"].to(x.dtype))
    return x + F.linear(F.gelu(F.linear(h, w["fc1"]), approximate="tanh"), w["fc2"])


class Block(nn.Module):
    def __init__(self, d, heads, device):
        super().__init__()
        self.heads, self.names = heads, [n for n, _ in param_spec(d)]
        for n, shape in param_spec(d):
            setattr(self, n, nn.Parameter(torch.empty(shape, device=device, dtype=FP32)))

    def forward(self, x):
        return block_fn(x, {n: getattr(self, n) for n in self.names}, self.heads)


@torch.no_grad()
def init_block_(blk, i, n_layers, seed):
    g = torch.Generator(device=blk.qkv.device)
    g.manual_seed(seed * 100003 + i + 1)
    for n in blk.names:
        p = getattr(blk, n)
        if n.startswith("ln"):
            p.fill_(1.0 if n.endswith("_w") else 0.0)
        else:
            p.normal_(0.0, 0.02 / math.sqrt(2 * n_layers) if n in ("proj", "fc2") else 0.02, generator=g)


class GPT(nn.Module):
    def __init__(self, a, device, with_blocks=True):
        super().__init__()
        self.d, self.vocab = a.d, a.vocab
        self.emb = nn.Parameter(torch.empty(a.vocab, a.d, device=device, dtype=FP32))  # tied with the head
        self.lnf_w = nn.Parameter(torch.ones(a.d, device=device, dtype=FP32))
        self.lnf_b = nn.Parameter(torch.zeros(a.d, device=device, dtype=FP32))
        with torch.no_grad():
            g = torch.Generator(device=device)
            g.manual_seed(a.seed * 100003)
            self.emb.normal_(0.0, 0.02, generator=g)
        self.blocks = None
        if with_blocks:
            self.blocks = nn.ModuleList([Block(a.d, a.heads, device) for _ in range(a.layers)])
            for i, b in enumerate(self.blocks):
                init_block_(b, i, a.layers, a.seed)

    def embed(self, idx):
        return F.embedding(idx, self.emb).float()

    def head_loss(self, x, tgt):
        h = F.layer_norm(x, (self.d,), self.lnf_w.to(x.dtype), self.lnf_b.to(x.dtype))
        logits = F.linear(h, self.emb)
        return F.cross_entropy(logits.float().view(-1, self.vocab), tgt.reshape(-1))

    def forward(self, idx, tgt):
        x = self.embed(idx)
        for b in self.blocks:
            x = b(x)
        return self.head_loss(x, tgt)


def autocast():
    return torch.autocast(DEV.type, dtype=BF16)


# ------------------------------------------------------------------------------------------ helpers
def sync():
    if CUDA:
        torch.cuda.synchronize()


class NullStream:
    """Stand-in for a CUDA stream/event on the CPU (lets the stream logic be checked without a GPU)."""
    def wait_event(self, e): pass
    def wait_stream(self, s): pass
    def record(self, s=None): pass
    def __enter__(self): return self
    def __exit__(self, *x): return False


def new_stream():
    return torch.cuda.Stream() if CUDA else NullStream()


def new_event():
    return torch.cuda.Event() if CUDA else NullStream()


def on(stream):
    return torch.cuda.stream(stream) if CUDA else NullStream()


REGISTERED = {"bytes": 0, "fallback": 0}


def alloc_pinned(numel, dtype, zero=False):
    """Exactly sized page-locked host buffer (torch's pin_memory rounds every block up to a power of two)."""
    t = torch.zeros(numel, dtype=dtype) if zero else torch.empty(numel, dtype=dtype)
    if not CUDA:
        return t
    nbytes = t.numel() * t.element_size()
    r = torch.cuda.cudart().cudaHostRegister(t.data_ptr(), nbytes, 0)
    if int(r) != 0:
        REGISTERED["fallback"] += 1
        t = t.pin_memory()
    else:
        REGISTERED["bytes"] += nbytes
    return t


def pcie_probe():
    """Pinned host <-> GPU copy rates, 1 GiB, one direction and both at once."""
    if not CUDA:
        return {}
    n = 1 << 30
    h1, h2 = alloc_pinned(n, torch.uint8), alloc_pinned(n, torch.uint8)
    g1, g2 = torch.empty(n, dtype=torch.uint8, device=DEV), torch.empty(n, dtype=torch.uint8, device=DEV)
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    res = {}
    for name, fn in (("h2d", lambda: g1.copy_(h1, non_blocking=True)),
                     ("d2h", lambda: h2.copy_(g2, non_blocking=True))):
        ts = []
        for _ in range(4):
            sync(); t0 = time.perf_counter(); fn(); sync(); ts.append(time.perf_counter() - t0)
        res[name + "_GBps"] = round(n / min(ts[1:]) / 1e9, 1)
    ts = []
    for _ in range(4):
        sync(); t0 = time.perf_counter()
        with torch.cuda.stream(s1): g1.copy_(h1, non_blocking=True)
        with torch.cuda.stream(s2): h2.copy_(g2, non_blocking=True)
        sync(); ts.append(time.perf_counter() - t0)
    res["bidir_total_GBps"] = round(2 * n / min(ts[1:]) / 1e9, 1)
    for h in (h1, h2):
        torch.cuda.cudart().cudaHostUnregister(h.data_ptr())
    REGISTERED["bytes"] -= 2 * n
    return res


def host_rss_gib():
    try:
        import psutil
        return round(psutil.Process().memory_info().rss / 2**30, 1)
    except Exception:
        return None


# ------------------------------------------------------------------------------------------ modes
def setup_resident(a):
    model = GPT(a, DEV)
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.wd,
                            fused=CUDA)

    info = {"optimizer": "torch AdamW fused, GPU" if CUDA else "torch AdamW, CPU", "dump": (model, opt)}
    if not RANKS.many:
        return accumulating_step(a, model, opt), info
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(model, device_ids=[torch.cuda.current_device()] if CUDA else None)
    info["data_parallel"] = "DDP (gradients all-reduced in buckets during the backward pass)"
    info["replicas"] = lambda: list(model.parameters())

    def micro_context(k):  # the backward passes of a step's micro-batches but the last reduce nothing
        return ddp.no_sync() if k < a.accum - 1 else contextlib.nullcontext()

    return accumulating_step(a, ddp, opt, micro_context=micro_context), info


def dump_tensors(a, model, opt, inp, tgt, out_dir, limit=256 << 20):
    """Writes the middle block's state after training as raw little-endian files (at most `limit` bytes each):
    what the fabric's storage tier would hold of a real model, for its compression figures. The gradients are
    those of one more micro-batch (the training loop leaves none behind)."""
    os.makedirs(out_dir, exist_ok=True)
    first = lambda t: t[0] if isinstance(t, list) else t
    with autocast():
        loss = model(first(inp), first(tgt))
    loss.backward()
    with torch.no_grad():
        _dump_block(a, model, opt, first(inp), out_dir, limit)
    opt.zero_grad(set_to_none=True)


def _dump_block(a, model, opt, inp, out_dir, limit):
    blk = model.blocks[len(model.blocks) // 2]
    params = [getattr(blk, n) for n in blk.names]
    flat = lambda ts: torch.cat([t.detach().reshape(-1) for t in ts])
    files = {
        "weights.bf16": flat(params).to(BF16),
        "master-weights.fp32": flat(params).float(),
        "adam-exp-avg.fp32": flat([opt.state[p]["exp_avg"] for p in params if p in opt.state]),
        "adam-exp-avg-sq.fp32": flat([opt.state[p]["exp_avg_sq"] for p in params if p in opt.state]),
        "grads.bf16": flat([p.grad if p.grad is not None else torch.zeros_like(p) for p in params]).to(BF16),
    }
    with autocast():
        x = model.embed(inp)
        for b in model.blocks[: len(model.blocks) // 2 + 1]:
            x = b(x)
    files["activations.bf16"] = x.reshape(-1).to(BF16)
    for name, t in files.items():
        raw = t.contiguous().view(torch.uint8).cpu().numpy().tobytes()[:limit]
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(raw)
    print(f"[{a.tag}] tensors of block {len(model.blocks) // 2} written to {out_dir}: {sorted(files)}", flush=True)


def accumulating_step(a, model, opt, before_micro=None, micro_context=None, before_step=None):
    """One optimizer step over a.accum micro-batches (loss / accum each; `before_micro(k)` runs before micro-batch
    k, inside `micro_context(k)`; `before_step()` before the optimizer's step), returning the step's mean loss: the
    loop of resident, allocator and vfabric alike."""

    def step(inp, tgt):
        total = 0.0
        for k in range(a.accum):
            if before_micro is not None:
                before_micro(k)
            with micro_context(k) if micro_context is not None else contextlib.nullcontext():
                with autocast():
                    loss = model(inp[k], tgt[k]) / a.accum
                loss.backward()
            total = total + loss.detach()
        if before_step is not None:
            before_step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return step


def size_bytes(text):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
    for u, m in units.items():
        if text.endswith(u):
            return int(float(text[: -len(u)]) * m)
    return int(text)


def setup_allocator(a):
    # main() made the fabric PyTorch's allocator before anything touched CUDA.
    step, info = setup_resident(a)
    info["allocator"] = f"vfabric.torch.use_as_allocator(budget={a.allocator_budget})"
    return step, info


def setup_vfabric(a):
    import tempfile
    import vfabric
    import vfabric.torch as vt
    n_block = sum(math.prod(s) for _, s in param_spec(a.d))
    # Host memory holds every block's compute copy, master weights and moments, and fp32 gradient sums (blocks
    # stepped on the CPU, or accumulating).
    per_block = n_block * (2 + 12 + (4 if a.accum > 1 or a.host_layers or a.auto_host else 0))
    # Data parallel: the node's agent holds the blocks of each of its ranks, and the GPU budget is each rank's.
    host = -(-int(RANKS.local_world * a.layers * per_block * 1.04 + (1 << 30)) // (1 << 30))
    budget = size_bytes(a.fabric_budget) * (RANKS.ranks_per_gpu if RANKS.many else 1)
    cfg = os.path.join(tempfile.mkdtemp(), "train.toml")
    with open(cfg, "w") as f:
        f.write(f"""[cluster]
name = "train"
[memory]
page_size = "2MiB"
gpu_budget = "{budget >> 20}MiB"
host_arena = "{host}GiB"
headroom_percent = 2
readahead = "0"
high_watermark_percent = 100
low_watermark_percent = 100
[[node]]
name = "local"
""")
    t0 = time.perf_counter()
    if RANKS.many:
        os.environ["VFABRIC_CONFIG"] = cfg  # for local rank 0, which starts the agent
        fabric = vfabric.connect()
    else:
        fabric = vfabric.Fabric(cfg)
    info = {"fabric_budget": a.fabric_budget, "host_arena_GiB": host, "fabric_start_s": round(time.perf_counter() - t0, 1),
            "device": fabric.device_kind, "lookahead": a.lookahead, "host_layers": a.host_layers,
            "host_chunk": a.host_chunk, "host_threads": a.host_threads or torch.get_num_threads(),
            "torch_threads": torch.get_num_threads()}
    root = GPT(a, DEV, with_blocks=False)
    layers = vt.stream([], fabric, lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.wd, lookahead=a.lookahead,
                       host_chunk=a.host_chunk, data_parallel=RANKS.many or None)
    if a.host_threads:
        torch.set_num_threads(a.host_threads)  # process-wide: every thread's intra-op operations
    if a.auto_host:
        info["host_layers"] = f"auto from {a.host_layers}"
    blocks = nn.ModuleList()
    t0 = time.perf_counter()
    for i in range(a.layers):  # same init as the other modes: build the block on the GPU, hand it to the fabric
        b = Block(a.d, a.heads, DEV)
        init_block_(b, i, a.layers, a.seed)
        blocks.append(layers.adopt(b, on_host=i >= a.layers - a.host_layers))
    if a.auto_host:
        layers.stream.balance_host_layers()
    if CUDA:
        torch.cuda.empty_cache()
    root.blocks = blocks
    info["adopt_s"] = round(time.perf_counter() - t0, 1)
    opt = torch.optim.AdamW(layers.other_parameters(root), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.wd,
                            fused=CUDA)
    info["optimizer"] = "blocks: torch._fused_adamw_ per block on the GPU in its backward; embedding: torch AdamW"
    info["fabric"] = fabric
    info["layers"] = layers
    info["gpu_arena_bytes"] = size_bytes(a.fabric_budget)
    average = None
    if RANKS.many:
        info["data_parallel"] = (f"the node's agent ({'this rank' if fabric.hosts_agent else 'local rank 0'} runs it), "
                                 "each block's gradients all-reduced before its AdamW, the embedding's before its step")
        info["replicas"] = lambda: [t for i in range(a.layers) for t in layers.master_weights(i).values()] + list(
            layers.other_parameters(root))

        def average():
            vt.average_gradients(layers.other_parameters(root))

    if a.schedule == "blocks":
        info["schedule"] = f"blocks, {a.group or a.accum} micro-batches a group"

        def by_blocks(inp, tgt):
            with autocast():
                total = layers.step_by_blocks(
                    list(zip(inp, tgt)), lambda mb: root.embed(mb[0]),
                    lambda x, mb: root.head_loss(x, mb[1]) / a.accum, group=a.group)
            if average is not None:
                average()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return total

        return by_blocks, info

    def before_micro(k):
        layers.accumulating = k < a.accum - 1  # the last micro-batch's backward steps the blocks

    return accumulating_step(a, root, opt, before_micro, before_step=average), info


def setup_fsdp(a):
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard, CPUOffloadPolicy, MixedPrecisionPolicy
    if not RANKS.many:
        port = 29500 + (os.getpid() % 1000)
        backend = "cpu:gloo,cuda:nccl" if CUDA else "gloo"
        dist.init_process_group(backend=backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    mesh = init_device_mesh(DEV.type, (RANKS.world,))
    model = GPT(a, DEV)  # built + initialised on the GPU (same weights as the other modes), then sharded out
    mp = MixedPrecisionPolicy(param_dtype=BF16, reduce_dtype=FP32, cast_forward_inputs=False)
    kw = dict(mesh=mesh, mp_policy=mp)
    if CUDA:
        kw["offload_policy"] = CPUOffloadPolicy(pin_memory=True)
    for b in model.blocks:
        fully_shard(b, **kw)
    fully_shard(model, **kw)
    if CUDA:
        torch.cuda.empty_cache()
    devs = {str(p.device) for p in model.parameters()}
    info = {"param_devices": sorted(devs), "mp": "param bf16, reduce fp32", "offload": CUDA}
    fused = a.fsdp_opt == "fused"
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.wd,
                            fused=fused, foreach=None if fused else True)
    info["optimizer"] = f"torch AdamW {'fused' if fused else 'foreach'}, CPU (threads={torch.get_num_threads()})"
    state = {"opt": opt}

    def step(inp, tgt):
        with autocast():
            loss = model(inp, tgt)
        loss.backward()
        t0 = time.perf_counter()
        try:
            state["opt"].step()
        except Exception as e:  # fused CPU AdamW on DTensor not available -> foreach, and say so
            if not fused or "fallback" in info:
                raise
            info["fallback"] = f"fused AdamW failed ({type(e).__name__}: {str(e)[:200]}); using foreach"
            print(info["fallback"], flush=True)
            state["opt"] = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                                             weight_decay=a.wd, foreach=True)
            info["optimizer"] = f"torch AdamW foreach, CPU (threads={torch.get_num_threads()})"
            state["opt"].step()
        info.setdefault("opt_step_s", []).append(round(time.perf_counter() - t0, 3))
        state["opt"].zero_grad(set_to_none=True)
        return loss

    n = sum(p.numel() for p in model.parameters())
    # per step: fp32 shard H2D at forward all-gather and again at backward (reshard_after_forward=True),
    # fp32 reduced grad D2H once.
    info["pcie_model"] = {"h2d_bytes": 8 * n, "d2h_bytes": 4 * n, "rule": "H2D 2x4 B/param, D2H 4 B/param"}
    return step, info


def setup_stream(a):
    L, d, keep = a.layers, a.d, a.act == "keep"
    spec = param_spec(d)
    offs, N = [], 0
    for name, shape in spec:
        n = math.prod(shape)
        offs.append((name, shape, N, n))
        N += n
    info = {"act": a.act, "opt_place": a.opt, "layer_params": N}
    info["pcie_probe"] = pcie_probe()

    t0 = time.perf_counter()
    w16 = alloc_pinned(L * N, BF16).view(L, N)        # compute copy of the weights
    g16 = alloc_pinned(L * N, BF16).view(L, N)        # gradients
    master = alloc_pinned(L * N, FP32).view(L, N)     # fp32 master weights
    m_h = alloc_pinned(L * N, FP32, zero=True).view(L, N)
    v_h = alloc_pinned(L * N, FP32, zero=True).view(L, N)
    for i in range(L):  # same init as the other modes: build the block on the GPU, flatten, copy out
        blk = Block(d, a.heads, DEV)
        init_block_(blk, i, L, a.seed)
        flat = torch.cat([getattr(blk, n).detach().reshape(-1) for n, *_ in offs])
        master[i].copy_(flat)
        w16[i].copy_(flat.to(BF16))
        del blk, flat
    sync()
    info["host_setup_s"] = round(time.perf_counter() - t0, 1)
    info["pinned_host_GiB"] = round(REGISTERED["bytes"] / 2**30, 1)
    info["pin_fallbacks"] = REGISTERED["fallback"]

    root = GPT(a, DEV, with_blocks=False)  # embedding/tied head + final LN, resident
    root_opt = torch.optim.AdamW(root.parameters(), lr=a.lr, betas=(0.9, 0.95), eps=1e-8, weight_decay=a.wd,
                                 fused=CUDA)

    wslot = [torch.empty(N, dtype=BF16, device=DEV) for _ in range(2)]
    gslot = [torch.empty(N, dtype=BF16, device=DEV) for _ in range(2)]
    slot_ptr = {wslot[s].untyped_storage().data_ptr(): s for s in range(2)}
    comp = torch.cuda.current_stream() if CUDA else NullStream()
    h2d, d2h = new_stream(), new_stream()
    ev_loaded, ev_free = [new_event() for _ in range(2)], [new_event() for _ in range(2)]
    ev_gready, ev_gfree = [new_event() for _ in range(2)], [new_event() for _ in range(2)]
    if a.opt == "gpu":
        oslot = [{k: torch.empty(N, dtype=dt, device=DEV) for k, dt in
                  (("p", FP32), ("m", FP32), ("v", FP32), ("g", BF16), ("w", BF16))} for _ in range(2)]
        g32 = torch.empty(N, dtype=FP32, device=DEV)
        ev_oloaded, ev_odone, ev_ofree = ([new_event() for _ in range(2)] for _ in range(3))
        step_t = torch.zeros((), dtype=FP32, device=DEV)
    else:
        g32c = torch.empty(N, dtype=FP32)
        step_t = torch.zeros((), dtype=FP32)
    adam_kw = dict(lr=a.lr, beta1=0.9, beta2=0.95, weight_decay=a.wd, eps=1e-8, amsgrad=False, maximize=False)
    moved = {"h2d": 0, "d2h": 0}

    def pack(t):
        s = slot_ptr.get(t.untyped_storage().data_ptr())
        if s is None:
            return t
        return (s, t.size(), t.stride(), t.storage_offset())

    def unpack(x):
        if isinstance(x, tuple):
            s, size, stride, off = x
            return wslot[s].as_strided(size, stride, off)  # layer i is always re-fetched into slot i % 2
        return x

    def fetch(i):
        s = i % 2
        with on(h2d):
            h2d.wait_event(ev_free[s])
            wslot[s].copy_(w16[i], non_blocking=True)
            ev_loaded[s].record(h2d)
        moved["h2d"] += N * 2

    def leaves(s):
        return {name: wslot[s][o:o + n].view(shape).detach().requires_grad_() for name, shape, o, n in offs}

    def opt_load(i):
        s, o = i % 2, oslot[i % 2]
        with on(h2d):
            h2d.wait_event(ev_ofree[s])
            o["p"].copy_(master[i], non_blocking=True)
            o["m"].copy_(m_h[i], non_blocking=True)
            o["v"].copy_(v_h[i], non_blocking=True)
            o["g"].copy_(g16[i], non_blocking=True)
            ev_oloaded[s].record(h2d)
        moved["h2d"] += N * 14

    def step(inp, tgt):
        h2d.wait_stream(d2h)  # last step's weight write-back has landed before we read w16
        d2h.wait_stream(h2d)  # last step's optimizer has read g16 before this step's grads overwrite it
        with autocast():
            x0 = root.embed(inp)
        x = x0.detach().requires_grad_()
        saved = []
        fetch(0)
        for i in range(L):  # ---- forward
            s = i % 2
            if i + 1 < L:
                fetch(i + 1)
            comp.wait_event(ev_loaded[s])
            xin = x
            if keep:
                W = leaves(s)
                with torch.autograd.graph.saved_tensors_hooks(pack, unpack), autocast():
                    out = block_fn(xin, W, a.heads)
                saved.append((xin, out, W))
                x = out.detach().requires_grad_()
            else:
                with torch.no_grad(), autocast():
                    out = block_fn(xin, {name: wslot[s][o:o + n].view(shape) for name, shape, o, n in offs},
                                   a.heads)
                saved.append(xin)
                x = out.requires_grad_()
            ev_free[s].record(comp)
        with autocast():
            loss = root.head_loss(x, tgt)
        loss.backward()
        grad = x.grad
        for i in reversed(range(L)):  # ---- backward
            s = i % 2
            if i <= L - 2 and i - 1 >= 0:  # layers L-1 and L-2 are still in their slots
                fetch(i - 1)
            comp.wait_event(ev_loaded[s])
            if keep:
                xin, out, W = saved[i]
                torch.autograd.backward(out, grad)
            else:
                xin = saved[i]
                W = leaves(s)
                with autocast():
                    out = block_fn(xin, W, a.heads)
                torch.autograd.backward(out, grad)
            grad = xin.grad
            comp.wait_event(ev_gfree[s])
            for name, shape, o, n in offs:
                gslot[s][o:o + n].copy_(W[name].grad.view(-1))
            ev_gready[s].record(comp)
            ev_free[s].record(comp)
            with on(d2h):
                d2h.wait_event(ev_gready[s])
                g16[i].copy_(gslot[s], non_blocking=True)
                ev_gfree[s].record(d2h)
            moved["d2h"] += N * 2
            saved[i] = None
            del W, out, xin
        x0.backward(grad)
        root_opt.step()
        root_opt.zero_grad(set_to_none=True)
        step_t.add_(1)
        # ---- optimizer over the streamed layers
        if a.opt == "gpu":
            h2d.wait_stream(d2h)  # grads are on the host before they are read back
            opt_load(0)
            for i in range(L):
                s, o = i % 2, oslot[i % 2]
                if i + 1 < L:
                    opt_load(i + 1)
                comp.wait_event(ev_oloaded[s])
                g32.copy_(o["g"])
                torch._fused_adamw_([o["p"]], [g32], [o["m"]], [o["v"]], [], [step_t], **adam_kw)
                o["w"].copy_(o["p"])
                ev_odone[s].record(comp)
                with on(d2h):
                    d2h.wait_event(ev_odone[s])
                    master[i].copy_(o["p"], non_blocking=True)
                    m_h[i].copy_(o["m"], non_blocking=True)
                    v_h[i].copy_(o["v"], non_blocking=True)
                    w16[i].copy_(o["w"], non_blocking=True)
                    ev_ofree[s].record(d2h)
                moved["d2h"] += N * 14
        else:
            if CUDA:
                d2h.synchronize()
            for i in range(L):
                g32c.copy_(g16[i])
                torch._fused_adamw_([master[i]], [g32c], [m_h[i]], [v_h[i]], [], [step_t], **adam_kw)
                w16[i].copy_(master[i])
        return loss

    info["optimizer"] = ("AdamW streamed per layer, torch._fused_adamw_ on GPU" if a.opt == "gpu" else
                         f"torch._fused_adamw_ on CPU over pinned buffers (threads={torch.get_num_threads()})")
    info["moved"] = moved
    return step, info


# ------------------------------------------------------------------------------------------ main
def main():
    a = parse()
    if RANKS.many:
        if a.mode not in ("resident", "fsdp", "vfabric"):
            raise SystemExit(f"data parallel runs (ranks of torchrun or mpirun) are resident, fsdp or vfabric, not {a.mode}")
        if a.dump_tensors:
            raise SystemExit("--dump-tensors is for one rank")
        if a.auto_host:
            raise SystemExit("--host-layers auto is for one rank: each rank would choose its own share")
        RANKS.start(a.port)
    if a.mode == "allocator":
        import vfabric.torch as vt
        vt.use_as_allocator(budget=a.allocator_budget)  # before anything allocates CUDA memory
    torch.manual_seed(a.seed)
    if CUDA and not RANKS.many:
        torch.cuda.set_device(0)
    t_setup = time.perf_counter()
    setup = {"resident": setup_resident, "fsdp": setup_fsdp, "stream": setup_stream, "vfabric": setup_vfabric,
             "allocator": setup_allocator}[a.mode]
    if a.accum > 1 and a.mode not in ("resident", "vfabric", "allocator"):
        raise SystemExit(f"--accum is for resident, vfabric and allocator, not {a.mode}")
    step, info = setup(a)
    sync()
    t_setup = time.perf_counter() - t_setup
    n_block = a.layers * sum(math.prod(s) for _, s in param_spec(a.d))
    n_total = n_block + a.vocab * a.d + 2 * a.d
    tokens = a.batch * a.seq * a.accum * RANKS.world  # all ranks'
    flops_tok = 6 * (n_block + a.vocab * a.d) + 6 * a.layers * a.seq * a.d  # matmuls + causal attention
    g = torch.Generator(device=DEV)
    g.manual_seed(1234 + RANKS.rank)  # each rank its own batch
    data = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=DEV, generator=g)
    inp, tgt = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    if a.mode in ("resident", "vfabric", "allocator"):
        # Micro-batches: the same batch again (one fixed batch, as in every mode); a step is their mean.
        inp, tgt = [inp] * a.accum, [tgt] * a.accum
    fabric = info.pop("fabric", None)
    dump = info.pop("dump", None)
    if a.dump_tensors and dump is None:
        raise SystemExit("--dump-tensors is for --mode resident")
    streamed = info.pop("layers", None)
    arena = info.pop("gpu_arena_bytes", 0)
    replicas = info.pop("replicas", None)
    if RANKS.many:
        info["ranks"] = RANKS.describe()
    say = print if RANKS.rank == 0 else (lambda *x, **k: None)  # rank 0 speaks for the job
    say(f"[{a.tag}] mode={a.mode} accum={a.accum} L={a.layers} d={a.d} heads={a.heads} V={a.vocab} S={a.seq} B={a.batch} "
          f"params={n_total/1e9:.3f}B state(16B/param)={16*n_total/2**30:.1f}GiB setup={t_setup:.1f}s "
          f"info={json.dumps({k: v for k, v in info.items() if k != 'moved'})}", flush=True)
    if CUDA and a.mode != "allocator":  # a pluggable allocator has no peak to reset: the pool's counts from start
        torch.cuda.reset_peak_memory_stats()
    times, losses = [], []
    waited0 = streamed.waited if streamed is not None else None
    busy0 = streamed.host_busy if streamed is not None else None
    stalls0 = fabric.stats().get("stalls") if fabric is not None else None
    if "moved" in info:
        mv0 = dict(info["moved"])
    if a.watchdog:
        import faulthandler
    for it in range(a.steps):
        sync()
        t0 = time.perf_counter()
        if a.watchdog:  # a step stuck past it says where each thread is
            faulthandler.dump_traceback_later(a.watchdog, repeat=True)
        loss = step(inp, tgt)
        sync()
        dt = time.perf_counter() - t0
        if a.watchdog:
            faulthandler.cancel_dump_traceback_later()
        lv = RANKS.mean(loss.item()) if RANKS.many else loss.item()
        times.append(dt)
        losses.append(lv)
        say(f"[{a.tag}] step {it} loss {lv:.4f} time {dt*1e3:.1f} ms", flush=True)
        if it == 0 and "moved" in info:
            mv1 = {k: info["moved"][k] - mv0[k] for k in mv0}
        if it == a.warmup - 1 and streamed is not None:
            waited0 = streamed.waited
            busy0 = streamed.host_busy
            if fabric is not None:
                stalls0 = fabric.stats().get("stalls")
    meas = times[a.warmup:] if len(times) > a.warmup else times
    med = statistics.median(meas)
    res = {"tag": a.tag, "mode": a.mode, "layers": a.layers, "d": a.d, "heads": a.heads, "vocab": a.vocab,
           "seq": a.seq, "batch": a.batch, "params": n_total, "tokens_per_step": tokens,
           "step_s_median": round(med, 4), "step_s_min": round(min(meas), 4), "step_s_all": [round(t, 4) for t in times],
           "tokens_per_s": round(tokens / med, 1), "model_tflops": round(flops_tok * tokens / med / 1e12, 1),
           "losses": [round(x, 4) for x in losses], "setup_s": round(t_setup, 1), "host_rss_GiB": host_rss_gib()}
    res["accum"] = a.accum
    if CUDA and a.mode == "allocator":
        import vfabric.torch as vt
        pool = vt.memory_stats()["pools"]["gpu0"]
        res["peak_alloc_GiB"] = round(pool["peak_allocated"] / 2**30, 2)
        res["peak_reserved_GiB"] = round(pool["peak_reserved"] / 2**30, 2)
        res["peak_gpu_GiB"] = res["peak_reserved_GiB"]
    elif CUDA:
        res["peak_alloc_GiB"] = round(torch.cuda.max_memory_allocated() / 2**30, 2)
        res["peak_reserved_GiB"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
        # What the run holds on the GPU at its peak: PyTorch's reserve, plus the fabric's arena (vfabric).
        res["peak_gpu_GiB"] = round((torch.cuda.max_memory_reserved() + arena) / 2**30, 2)
    if streamed is not None and a.steps > a.warmup:
        per = a.steps - a.warmup
        res["waited_ms_per_step"] = {k: round((v - waited0[k]) / per * 1e3, 1) for k, v in streamed.waited.items()}
        res["host_busy_ms_per_step"] = {k: round((v - busy0[k]) / per * 1e3, 1) for k, v in streamed.host_busy.items()}
    if streamed is not None and streamed.stream.balance is not None:
        res["host_share"] = streamed.stream.balance.describe()
    fabric_stats = fabric.stats() if fabric is not None else {}
    if "traffic" in fabric_stats:
        traffic = fabric_stats["traffic"]
        res["fabric_traffic_GB"] = {k: round(v / 1e9, 1) for k, v in traffic.items() if k != "stages"}
        # Where the fabric's callers waited, a measured step's share (milliseconds; counts as they are).
        if a.steps > a.warmup and stalls0 is not None:
            stalls = fabric_stats["stalls"]
            per = a.steps - a.warmup
            res["fabric_stalls_per_step"] = {
                k.replace("_ns", "_ms"): round((v - stalls0[k]) / per / (1e6 if k.endswith("_ns") else 1), 1)
                for k, v in stalls.items()
            }
    if "moved" in info:
        res["pcie_bytes_per_step"] = mv1
        info = {k: v for k, v in info.items() if k != "moved"}
    if RANKS.many:
        res["world"] = RANKS.world
        # Every rank took the same steps: the same weights everywhere (FSDP's are sharded: one copy).
        if replicas is not None:
            res["replicas_equal"] = RANKS.same_everywhere(replicas())
    res["info"] = info
    line = json.dumps(res)
    say("RESULT " + line, flush=True)
    if a.json and RANKS.rank == 0:
        with open(a.json, "a") as f:
            f.write(line + "\n")
    if a.dump_tensors:
        dump_tensors(a, *dump, inp, tgt, a.dump_tensors)
    if RANKS.many:
        if streamed is not None:
            streamed.close()  # the agent outlives this rank: its regions go now
        RANKS.stop()
        if res.get("replicas_equal") is False:
            raise SystemExit(f"[{a.tag}] the ranks' weights differ after {a.steps} steps")
    elif a.mode == "fsdp":
        import torch.distributed as dist
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
