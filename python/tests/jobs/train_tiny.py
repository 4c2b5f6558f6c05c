"""A few training steps of a small transformer, on PyTorch's own allocator (argv[1] == "torch"), on an embedded
fabric (argv[1] == "vfabric") or on the node's agent through a client (argv[1] == "vfabric-client": this process
is local rank 0 of a one-rank job, so it starts the agent); prints the losses (and the fabric's figures) as one
JSON line."""

import json
import os
import sys

mode = sys.argv[1]
if mode == "vfabric":
    import vfabric.torch

    vfabric.torch.use_as_allocator(budget="8GiB")
elif mode == "vfabric-client":
    import tempfile

    import vfabric
    import vfabric.torch

    folder = tempfile.mkdtemp()
    config = os.path.join(folder, "agent.toml")
    with open(config, "w") as f:
        f.write('[cluster]\nname = "t"\n[memory]\ngpu_budget = "8GiB"\nhost_arena = "1GiB"\n[[node]]\nname = "t"\n')
    os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1", VFABRIC_CONFIG=config)
    os.environ["VFABRIC_SOCKET"] = os.path.join(folder, "agent.sock")
    client = vfabric.connect()
    vfabric.torch.use_as_allocator(client=client)

import torch
import torch.nn as nn

torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = False
layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, dropout=0.0)
model = nn.Sequential(nn.Embedding(1000, 512), nn.TransformerEncoder(layer, 4), nn.Linear(512, 1000)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randint(0, 1000, (8, 129), device="cuda", generator=torch.Generator(device="cuda").manual_seed(1))
losses = []
for _ in range(8):
    logits = model(data[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 1000), data[:, 1:].reshape(-1))
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
# PyTorch keeps no figures of its own for a pluggable allocator: the fabric's stand in.
if mode != "torch":
    stats, peak = vfabric.torch.memory_stats(), None
else:
    stats, peak = None, torch.cuda.max_memory_allocated()
print(json.dumps({"losses": losses, "stats": stats, "max_allocated": peak}))
