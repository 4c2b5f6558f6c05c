#!/usr/bin/env python3
"""The training benchmark on a Hugging Face model as users bring it: a `transformers` Llama built from its
config, trained through its unchanged forward by an ordinary loop (torch.optim.AdamW with HF's param groups,
a cosine LR schedule, `clip_grad_norm_`), one way per invocation:

  resident : the model on the GPU, fp32 weights, AdamW(fused), bf16 autocast (the upper bound).
  offload  : the same loop with one line added, `vfabric.torch.offload(model, budget=...)`: the decoder layers
             streamed through the GPU by the fabric, the loop's optimizer stepping them (step="optimizer").
  offload_backward : offload(..., step="backward"): each layer steps inside the backward pass (no clipping or
             schedule: the stream's own AdamW), the schedule the project's GPT benchmark runs.

Same seed => same initial weights and batch in every mode: compare the loss columns. Prints a `RESULT {json}`.
"""
import argparse
import json
import math
import time

import torch
import transformers


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", required=True, choices=["resident", "offload", "offload_backward"])
    p.add_argument("--layers", type=int, default=20)
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=11008)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=2048)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--budget", default="10GiB", help="offload: the fabric's GPU arena")
    p.add_argument("--host-layers", type=int, default=0)
    p.add_argument("--clip", type=float, default=1.0)
    p.add_argument("--json", default=None)
    return p.parse_args()


def main():
    a = parse()
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    cfg = transformers.LlamaConfig(vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.intermediate,
                                   num_hidden_layers=a.layers, num_attention_heads=a.heads,
                                   num_key_value_heads=a.heads, max_position_embeddings=a.seq)
    torch.manual_seed(0)
    t0 = time.perf_counter()
    with dev:
        model = transformers.AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    info = {"mode": a.mode, "params_B": round(params / 1e9, 3), "build_s": round(time.perf_counter() - t0, 1)}
    if a.mode.startswith("offload"):
        import vfabric.torch as vt

        t0 = time.perf_counter()
        step = "optimizer" if a.mode == "offload" else "backward"
        vt.offload(model, budget=a.budget, step=step, host_layers=a.host_layers)
        if dev.type == "cuda":
            torch.cuda.empty_cache()
        info.update(offload_s=round(time.perf_counter() - t0, 1), budget=a.budget, step=step,
                    host_layers=a.host_layers)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, fused=dev.type == "cuda")
    sched = transformers.get_scheduler("cosine", opt, num_warmup_steps=2, num_training_steps=1000)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, a.vocab, (a.batch, a.seq), generator=g).to(dev)
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    losses, times, norms = [], [], []
    for s in range(a.steps):
        torch.cuda.synchronize() if dev.type == "cuda" else None
        t = time.perf_counter()
        with torch.autocast(dev.type, dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        if a.mode != "offload_backward":
            norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)))
        opt.step()
        if a.mode != "offload_backward":
            sched.step()
        opt.zero_grad()
        losses.append(round(float(loss), 4))
        torch.cuda.synchronize() if dev.type == "cuda" else None
        times.append(time.perf_counter() - t)
        print(f"step {s} loss {losses[-1]:.4f} {times[-1]:.3f} s", flush=True)
    timed = times[a.warmup:]
    step_s = sum(timed) / len(timed)
    info.update(losses=losses, grad_norms=[round(n, 4) for n in norms], step_s=round(step_s, 4),
                tokens_per_s=round(a.batch * a.seq / step_s, 1), seq=a.seq, batch=a.batch)
    if dev.type == "cuda":
        info["torch_peak_GiB"] = round(torch.cuda.max_memory_reserved() / 2**30, 2)
        info["gpu"] = torch.cuda.get_device_name()
    if a.mode.startswith("offload"):
        import vfabric.torch as vt

        layers = vt.streamed(model)
        info["waited_s"] = {k: round(v, 2) for k, v in layers.waited.items()}
        arena = layers.fabric.stats()["directory"]["devices"][0]["frames"] * layers.fabric.page_size
        info["fabric_arena_GiB"] = round(arena / 2**30, 2)
        info["gpu_total_GiB"] = round(info.get("torch_peak_GiB", 0) + arena / 2**30, 2)
    print("RESULT " + json.dumps(info), flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(info) + "\n")
    assert all(math.isfinite(x) for x in losses)


if __name__ == "__main__":
    main()
