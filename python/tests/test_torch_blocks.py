"""`StreamedLayers.step_by_blocks` against plain PyTorch: a small stack of layers streamed through the fabric and
trained block by block (micro-batches in groups) takes the same AdamW steps, to float32 rounding, as the same
stack resident with `torch.optim.AdamW` and gradients accumulated micro-batch by micro-batch. Runs on the
emulated device (CPU tensors) or on a GPU; skipped where torch is missing."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import vfabric  # noqa: E402
import vfabric.torch as vtorch  # noqa: E402

D, LAYERS, MICRO, STEPS = 32, 4, 5, 3
# An eps far above the gradients' scale makes AdamW's step nearly proportional to the gradient (lr / eps times
# it): gradients summed twice, or half of them, move the weights twice or half as far, which a plain AdamW step
# (about lr times the gradient's sign at first) would hide.
ADAMW = dict(lr=1.0, betas=(0.9, 0.95), eps=10.0, weight_decay=0.1)


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)
        self.norm = nn.LayerNorm(D)

    def forward(self, x):
        return x + torch.tanh(self.lin(self.norm(x)))


def models(device):
    torch.manual_seed(7)
    first, layers, last = nn.Linear(8, D), nn.ModuleList(Layer() for _ in range(LAYERS)), nn.Linear(D, 1)
    copy = [nn.Linear(8, D), nn.ModuleList(Layer() for _ in range(LAYERS)), nn.Linear(D, 1)]
    for mine, theirs in zip(copy, (first, layers, last)):
        mine.load_state_dict(theirs.state_dict())
    return [m.to(device) for m in (first, layers, last)], [m.to(device) for m in copy]


def micro_batches(device):
    g = torch.Generator().manual_seed(100)
    return [(torch.randn(3, 8, generator=g).to(device), torch.randn(3, 1, generator=g).to(device)) for _ in range(MICRO)]


def loss_of(y, target):
    return ((y - target) ** 2).mean() / MICRO


def close(ours, theirs, what):
    """Equal to float32 rounding (the sums add the same gradients in another order)."""
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6, msg=lambda m: f"{what}: {m}")


# Groups of micro-batches (0: all of them); the last two layers' steps on the CPU's worker.
@pytest.mark.parametrize("group,host_layers", [(0, 0), (1, 0), (2, 0), (2, 2)])
def test_block_by_block_steps_as_plain_pytorch_does(group, host_layers):
    fabric = vfabric.Fabric()
    (first, layers, last), (r_first, r_layers, r_last) = models("cpu")
    streamed = vtorch.stream(layers, fabric, compute_dtype=torch.float32, lookahead=1, host_layers=host_layers,
                             **ADAMW)
    device = streamed.device
    first, last = first.to(device), last.to(device)
    r_first, r_layers, r_last = r_first.to(device), r_layers.to(device), r_last.to(device)
    ours = torch.optim.AdamW([*first.parameters(), *last.parameters()], **ADAMW)
    theirs = torch.optim.AdamW([*r_first.parameters(), *r_layers.parameters(), *r_last.parameters()], **ADAMW)

    mbs = micro_batches(device)  # the same ones every step: the loss falls
    losses, reference = [], []
    for _ in range(STEPS):
        ours.zero_grad()
        total = streamed.step_by_blocks(mbs, lambda mb: first(mb[0]), lambda x, mb: loss_of(last(x), mb[1]), group=group)
        ours.step()
        losses.append(total.item())

        theirs.zero_grad()
        total = 0.0
        for x, target in mbs:
            h = r_first(x)
            for layer in r_layers:
                h = layer(h)
            loss = loss_of(r_last(h), target)
            loss.backward()
            total += loss.item()
        theirs.step()
        reference.append(total)

    assert losses == pytest.approx(reference, rel=1e-5), (losses, reference)
    assert losses[-1] < losses[0], "the stack learns"
    for i, layer in enumerate(r_layers):
        master = streamed.master_weights(i)
        for name, p in layer.named_parameters():
            close(master[name], p.detach().cpu(), f"layer {i} {name}")
    for mine, ref in ((first, r_first), (last, r_last)):
        for p, q in zip(mine.parameters(), ref.parameters()):
            close(p.detach().cpu(), q.detach().cpu(), "outside the streamed layers")
    streamed.close()


def test_block_by_block_refuses_no_micro_batches():
    fabric = vfabric.Fabric()
    (first, layers, last), _ = models("cpu")
    streamed = vtorch.stream(layers, fabric, compute_dtype=torch.float32)
    with pytest.raises(ValueError, match="at least one micro-batch"):
        streamed.step_by_blocks([], lambda mb: mb, lambda x, mb: x.sum())
    streamed.close()
