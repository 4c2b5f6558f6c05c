"""`vfabric.torch.offload` on Hugging Face `transformers` models as users bring them (built from tiny configs, on
the emulated device, fp32): the unchanged HF forward with its keyword arguments, dropout on, trained by the
loop's own `torch.optim.AdamW` with param groups (no decay on biases and norms), an LR schedule and global-norm
clipping, against the same model unstreamed. The losses, the gradient norms and every weight after the steps
must agree; frozen parameters must not move; a resumed run must give the same losses bit for bit."""

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import vfabric  # noqa: E402
import vfabric.torch as vt  # noqa: E402

COMMON = dict(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=64, attention_dropout=0.1, tie_word_embeddings=False)


def configs():
    t = transformers
    return {
        "llama": lambda: t.LlamaConfig(**COMMON),
        "qwen3": lambda: t.Qwen3Config(**COMMON, head_dim=8),
        "mistral": lambda: t.MistralConfig(**COMMON, sliding_window=None),
        "gemma2": lambda: t.Gemma2Config(**COMMON, head_dim=8),
        "mixtral": lambda: t.MixtralConfig(**COMMON, num_local_experts=4, num_experts_per_tok=2),
        "gpt2": lambda: t.GPT2Config(vocab_size=128, n_embd=32, n_layer=3, n_head=4, n_positions=64,
                                     resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1),
    }


FAMILIES = sorted(configs())
STEPS = 3


def build(family, seed=0):
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(configs()[family](), attn_implementation="eager")
    return model.train()


def optimizer(model, lr=1e-2):
    """AdamW with the param groups HF's Trainer makes: no weight decay on biases and norms."""
    decay = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.requires_grad and p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                             lr=lr, betas=(0.9, 0.95))


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, 128, (2, 16), generator=g)


def train(model, opt, sched, steps, first=0, clip=0.05):
    losses, norms = [], []
    for step in range(first, first + steps):
        ids = batch(step)
        torch.manual_seed(1000 + step)  # the same dropout masks in both runs
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), clip)))
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(loss))
    return losses, norms


def schedule(opt):
    return transformers.get_scheduler("linear", opt, num_warmup_steps=1, num_training_steps=10)


def offloaded(model, **kw):
    return vt.offload(model, budget="96MiB", compute_dtype=torch.float32, **kw)


@pytest.fixture(autouse=True)
def emulated():
    if vfabric.Fabric().device_kind != "emulated":
        pytest.skip("these tests compare on the CPU (the emulated device)")


@pytest.mark.parametrize("family", FAMILIES)
def test_a_streamed_hf_model_trains_as_the_unstreamed_one(family):
    ref = build(family)
    ours = offloaded(copy.deepcopy(ref))
    assert len(vt.streamed(ours).modules) == 3, "the decoder layers are found and streamed"
    opt_r, opt_o = optimizer(ref), optimizer(ours)
    lr, ln = train(ref, opt_r, schedule(opt_r), STEPS)
    lo, no = train(ours, opt_o, schedule(opt_o), STEPS)
    assert lo == pytest.approx(lr, rel=1e-5, abs=1e-6), (family, lr, lo)
    assert no == pytest.approx(ln, rel=1e-4), "clip_grad_norm_ sees the streamed gradients"
    assert ln[0] > 0.05, "the clipping is in effect"
    theirs, mine = ref.state_dict(), ours.state_dict()
    assert sorted(theirs) == sorted(mine)
    moved = 0
    for name, want in theirs.items():
        got = mine[name].to(want.device)
        assert torch.allclose(got, want, rtol=1e-4, atol=2e-6), (family, name, (got - want).abs().max())
        moved += not torch.equal(want, build(family).state_dict()[name])
    assert moved > len(theirs) // 2, "the weights moved"


def test_frozen_parameters_stay_and_the_rest_trains_as_unstreamed():
    ref = build("llama")
    for model in (ref,):
        for n, p in model.named_parameters():
            if "q_proj" in n or "embed" in n:
                p.requires_grad_(False)
    before = {n: p.detach().clone() for n, p in ref.named_parameters()}
    ours = offloaded(copy.deepcopy(ref))
    opt_r, opt_o = optimizer(ref), optimizer(ours)
    lr, _ = train(ref, opt_r, schedule(opt_r), STEPS)
    lo, _ = train(ours, opt_o, schedule(opt_o), STEPS)
    assert lo == pytest.approx(lr, rel=1e-5)
    mine = ours.state_dict()
    for n, p in ref.named_parameters():
        if not p.requires_grad:
            assert torch.equal(mine[n].cpu(), before[n]), f"{n} is frozen"
        else:
            assert torch.allclose(mine[n].cpu(), p.detach(), rtol=1e-4, atol=2e-6), n


def test_a_resumed_run_continues_bit_for_bit(tmp_path):
    def fresh():
        model = offloaded(build("llama"))
        opt = optimizer(model)
        return model, opt, schedule(opt)

    model, opt, sched = fresh()
    train(model, opt, sched, 2)
    path = tmp_path / "ckpt.pt"
    torch.save({"model": model.state_dict(), "optim": vt.optimizer_state_dict(opt), "sched": sched.state_dict()}, path)
    straight, _ = train(model, opt, sched, 2, first=2)

    model, opt, sched = fresh()
    saved = torch.load(path)
    model.load_state_dict(saved["model"])
    vt.load_optimizer_state_dict(opt, saved["optim"])
    sched.load_state_dict(saved["sched"])
    resumed, _ = train(model, opt, sched, 2, first=2)
    assert resumed == straight


def test_the_saved_optimizer_state_loads_into_an_unstreamed_model():
    ours = offloaded(build("llama"))
    opt = optimizer(ours)
    train(ours, opt, schedule(opt), 2)
    ref = build("llama")
    ref.load_state_dict(ours.state_dict())
    opt_r = optimizer(ref)
    opt_r.load_state_dict(vt.optimizer_state_dict(opt))
    sr, so = schedule(opt_r), schedule(opt)
    for s in (sr, so):
        s.step(), s.step()
    lr, _ = train(ref, opt_r, sr, 1, first=2)
    lo, _ = train(ours, opt, so, 1, first=2)
    assert lo == pytest.approx(lr, rel=1e-5)


def test_gradient_accumulation_adds_up_until_the_optimizer_steps():
    ref = build("gpt2")
    ours = offloaded(copy.deepcopy(ref))
    for model in (ref, ours):
        opt = optimizer(model)
        for k in range(3):  # three micro-batches, one step
            ids = batch(k)
            torch.manual_seed(k)
            (model(input_ids=ids, labels=ids).loss / 3).backward()
        opt.step()
    mine = ours.state_dict()
    for n, want in ref.state_dict().items():
        assert torch.allclose(mine[n].cpu(), want, rtol=1e-4, atol=2e-6), n


def test_an_optimizer_without_the_streamed_parameters_is_refused():
    ours = offloaded(build("llama"))
    some = [p for n, p in ours.named_parameters() if "layers" not in n or p.dim() < 2]  # the matrices missing
    opt = torch.optim.AdamW(some, lr=1e-2)
    train_once = lambda: train(ours, opt, schedule(opt), 1)  # noqa: E731
    train_once()
    with pytest.raises(RuntimeError, match="none holds the streamed parameter"):
        train_once()


def test_other_uses_of_a_streamed_gradient_and_unknown_optimizers_raise_clearly():
    ours = offloaded(build("llama"))
    ids = batch(0)
    ours(input_ids=ids, labels=ids).loss.backward()
    streamed = [p for p in ours.parameters() if p.grad is not None and type(p.grad).__name__ == "StreamedGrad"]
    assert streamed
    with pytest.raises(RuntimeError, match="lives in the fabric"):
        streamed[0].grad.sum()
    with pytest.raises(TypeError, match="SGD"):
        torch.optim.SGD(ours.parameters(), lr=0.1).step()


def test_the_host_memory_a_model_needs_is_checked_before_anything_moves(monkeypatch):
    import vfabric._torch_offload as off

    model = build("llama")
    monkeypatch.setattr(off, "_available", lambda: 1 << 20)
    with pytest.raises(vfabric.OutOfMemory, match="host memory"):
        vt.offload(model, budget="96MiB")
    assert all(p.device.type == "cpu" and p.stride() == p.contiguous().stride() for p in model.parameters()), \
        "the model is left as it was"


def test_inference_without_gradients_runs_the_layers_once_with_their_cache():
    ref = build("llama").eval()
    ours = offloaded(copy.deepcopy(ref)).eval()
    ids = batch(0)
    with torch.no_grad():
        want = ref.generate(ids, max_new_tokens=4, do_sample=False)
        got = ours.generate(ids, max_new_tokens=4, do_sample=False)
    assert torch.equal(want, got)


@pytest.mark.parametrize("init_scale", [2.0**10, 3e38])
def test_a_gradscaler_unscales_the_streamed_gradients_and_skips_overflowed_steps(init_scale):
    ref = build("llama")
    ours = offloaded(copy.deepcopy(ref))
    out = []
    for model in (ref, ours):
        opt = optimizer(model)
        scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=1)
        losses = []
        for step in range(2):
            ids = batch(0)  # the same batch and masks: a skipped step gives the same loss again
            torch.manual_seed(0)
            loss = model(input_ids=ids, labels=ids).loss
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            scaler.step(opt)
            scaler.update()
            opt.zero_grad()
            losses.append(float(loss))
        out.append((losses, scaler.get_scale()))
    (lr, sr), (lo, so) = out
    assert so == sr, "the same steps were skipped"
    assert lo == pytest.approx(lr, rel=1e-5)
    skipped = init_scale > 1e38
    assert (lr[1] == lr[0]) == skipped, "an overflowed step leaves the weights as they were"


class _Tokens(torch.utils.data.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, k):
        ids = batch(k)[0]
        return {"input_ids": ids, "labels": ids}


def test_transformers_trainer_trains_an_offloaded_model_as_the_unstreamed_one(tmp_path):
    """`transformers.Trainer` as it is (its AdamW, param groups, linear schedule, clipping through accelerate):
    the offloaded model needs no integration code."""

    def run(model, out):
        args = transformers.TrainingArguments(
            output_dir=str(out), per_device_train_batch_size=2, max_steps=3, learning_rate=1e-2, weight_decay=0.1,
            max_grad_norm=0.05, lr_scheduler_type="linear", warmup_steps=1, logging_steps=1, report_to=[],
            use_cpu=True, save_strategy="no", seed=0, dataloader_num_workers=0, disable_tqdm=True)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=_Tokens())
        trainer.train()
        return [x for h in trainer.state.log_history if "loss" in h for x in (h["loss"], h["grad_norm"])]

    start = build("llama").state_dict()
    ref = build("llama")
    ours = offloaded(copy.deepcopy(ref))
    want, got = run(ref, tmp_path / "ref"), run(ours, tmp_path / "ours")
    assert got == pytest.approx(want, rel=1e-5)
    mine = ours.state_dict()
    for name, w in ref.state_dict().items():
        assert torch.allclose(mine[name].cpu(), w, rtol=1e-4, atol=2e-6), name
    assert not torch.equal(mine["model.layers.0.mlp.up_proj.weight"].cpu(), start["model.layers.0.mlp.up_proj.weight"])
