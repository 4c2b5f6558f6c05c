"""The layer stream (vfabric.streaming) on NumPy arrays and the emulated device: a small residual MLP trained with
its layers' state in the fabric, on a GPU too small to hold it, against the same model held in NumPy arrays.
The schedule, the sub-arrays of each layer's regions, the optimizer's bookkeeping and gradient accumulation
must give the resident model's numbers bit for bit; the fabric must have prefetched and written back."""

import threading
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import numpy as np
import pytest

import vfabric
from vfabric.numpy_ops import NumpyOps, adamw
from vfabric.streaming import AdamW, LayerStream, ParamSpec

D, H, LAYERS, ROWS = 64, 256, 6, 32
OPT = AdamW(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)

# One emulated GPU of 32 frames of 64 KiB: a layer takes 9 (2 of fp16 matrices and 1 of vectors, 7 of fp32 states,
# in 3 pieces) and 3 more of gradient sums, so six layers (54, or 72) do not fit and every step evicts and fetches,
# from a device too fragmented for one run of a whole layer's states.
TIGHT = """
[cluster]
name = "stream"
[device]
backend = "emulated"
emulated_gpus = 1
emulated_gpu_memory = "64MiB"
[memory]
page_size = "64KiB"
gpu_budget = "2MiB"
host_arena = "16MiB"
headroom_percent = 0
readahead = "0"
high_watermark_percent = 100
low_watermark_percent = 100
[[node]]
name = "local"
"""

def specs():
    return [ParamSpec("a", (D, H), "float16"), ParamSpec("b", (H, D), "float16"), ParamSpec("bias", (D,), "float32")]


def init(i):
    r = np.random.default_rng(100 + i)
    return {
        "a": (r.standard_normal((D, H)) * 0.1).astype(np.float32),
        "b": (r.standard_normal((H, D)) * 0.1).astype(np.float32),
        "bias": np.zeros(D, dtype=np.float32),
    }


def forward(x, w):
    """y = x + relu(x a) b + bias, computed in fp32 from the compute copy; returns y and what backward needs."""
    a, b = w["a"].astype(np.float32), w["b"].astype(np.float32)
    h = x @ a
    r = np.maximum(h, 0)
    return x + r @ b + w["bias"], (h, r, a, b)


def backward(x, gy, saved):
    h, r, a, b = saved
    dr = gy @ b.T
    dh = dr * (h > 0)
    return gy + dh @ a.T, {"a": x.T @ dh, "b": r.T @ gy, "bias": gy.sum(0)}


def batch(step):
    r = np.random.default_rng(7 + step)
    return r.standard_normal((ROWS, D)).astype(np.float32), r.standard_normal((ROWS, D)).astype(np.float32)


def loss_and_grad(y, t):
    diff = y - t
    return float(0.5 * np.sum(diff * diff) / ROWS), diff / np.float32(ROWS)


class Resident:
    """The reference: fp32 master weights, moments and a compute copy in NumPy arrays."""

    def __init__(self):
        self.master = [init(i) for i in range(LAYERS)]
        self.m = [{k: np.zeros_like(v) for k, v in p.items()} for p in self.master]
        self.v = [{k: np.zeros_like(v) for k, v in p.items()} for p in self.master]
        self.steps = 0
        self.acc = None

    def compute(self, i):
        return {"a": self.master[i]["a"].astype(np.float16), "b": self.master[i]["b"].astype(np.float16), "bias": self.master[i]["bias"].copy()}

    def gradients(self, x, t):
        """The loss of one micro-batch and its gradients, layer by layer."""
        xs, saved = [], []
        for i in range(LAYERS):
            xs.append(x)
            x, s = forward(x, self.compute(i))
            saved.append(s)
        loss, g = loss_and_grad(x, t)
        grads = [None] * LAYERS
        for i in reversed(range(LAYERS)):
            g, grads[i] = backward(xs[i], g, saved[i])
        return loss, [{k: v.astype(np.float32) for k, v in gr.items()} for gr in grads]

    @staticmethod
    def add_up(acc, grads):
        # The stream adds the new micro-batch's gradient to the sum so far, in that order.
        return grads if acc is None else [{k: gr[k] + ac[k] for k in gr} for gr, ac in zip(grads, acc)]

    def step(self, grads):
        self.steps += 1
        for i in range(LAYERS):
            for k in self.master[i]:
                adamw(self.master[i][k], grads[i][k], self.m[i][k], self.v[i][k], self.steps, OPT)

    def micro(self, x, t, step_now):
        loss, grads = self.gradients(x, t)
        self.acc = self.add_up(self.acc, grads)
        if step_now:
            self.step(self.acc)
            self.acc = None
        return loss


class Streamed:
    """The same model with its layers' state in the fabric, run through a LayerStream; the last `on_host` layers
    take their optimizer step on the CPU."""

    def __init__(self, fabric, on_host=0, host_chunk=0, grad_reduce=None):
        # Pieces of 3 pages of states (16384 parameters): a layer's states come in 3 pieces.
        self.stream = LayerStream(
            fabric, "gpu0", NumpyOps(), OPT, lookahead=1, host_ops=NumpyOps(), piece_bytes=192 << 10,
            host_chunk=host_chunk, grad_reduce=grad_reduce,
        )
        for i in range(LAYERS):
            values = init(i)
            self.stream.add_layer(specs(), lambda name, v=values: v[name].reshape(-1), on_host=i >= LAYERS - on_host)

    def micro(self, x, t, step_now):
        s = self.stream
        s.accumulating = not step_now
        xs = []
        for i in range(LAYERS):
            xs.append(x)
            w = s.forward_weights(i)
            x, _ = forward(x, w)
            del w
            s.forward_done(i)
        loss, g = loss_and_grad(x, t)
        for i in reversed(range(LAYERS)):
            w = s.backward_weights(i)
            _, saved = forward(xs[i], w)  # recomputed from the layer's input
            g, grads = backward(xs[i], g, saved)
            del w, saved
            s.backward_done(i, grads)
            del grads
        return loss


def master_of(stream, i):
    raw = stream.master_weights(i)
    return {k: np.frombuffer(v, dtype=np.float32) for k, v in raw.items()}


@pytest.fixture
def tight(tmp_path):
    path = tmp_path / "tight.toml"
    path.write_text(TIGHT)
    return vfabric.Fabric(str(path))


# The CPU's steps in chunks of 1000 parameters too: chunks that end inside a parameter and across them.
@pytest.mark.parametrize("micro_batches,on_host,host_chunk", [(1, 0, 0), (3, 0, 0), (1, 3, 0), (3, 2, 0), (1, 3, 1000)])
def test_streamed_layers_train_as_the_resident_model_does(tight, micro_batches, on_host, host_chunk):
    ref, run = Resident(), Streamed(tight, on_host, host_chunk)
    for step in range(4):
        for k in range(micro_batches):
            x, t = batch(10 * step + k)
            last = k == micro_batches - 1
            want, got = ref.micro(x, t, last), run.micro(x, t, last)
            assert got == want, f"step {step} micro-batch {k}: loss {got} != {want}"
    run.stream.flush()
    for i in range(LAYERS):
        assert run.stream.steps(i) == 4
        got = master_of(run.stream, i)
        for k, v in ref.master[i].items():
            assert np.array_equal(got[k], v.reshape(-1)), f"layer {i} {k}"
    stats = tight.stats()
    traffic = stats["traffic"]
    assert stats["directory"]["leases"] == 0, "every lease released"
    assert traffic["written_back"] > 0 and traffic["prefetched"] > 0, traffic
    # Every step fetched the states of layers the GPU could not keep.
    assert traffic["fetched"] >= 4 * 7 * (64 << 10), traffic
    # The CPU's share is timed part by part when it steps layers, and not at all otherwise.
    assert (run.stream.host_busy["adamw"] > 0) == (on_host > 0), run.stream.host_busy
    run.stream.close()
    assert tight.stats()["directory"]["regions"] == 0


class ThreadMean:
    """An all-reduce (the mean) between ranks that are threads of this process: each rank's array, added in rank
    order, divided by the ranks; every rank gets the same bits."""

    def __init__(self, ranks):
        self.ranks, self.slots, self.barrier, self.calls = ranks, [None] * ranks, threading.Barrier(ranks, timeout=60), 0
        self.pools = []

    @staticmethod
    def mean(arrays):
        total = arrays[0].copy()
        for a in arrays[1:]:
            total += a
        return total / np.float32(len(arrays))

    def of_rank(self, r):
        def reduce(g):
            self.slots[r] = g.copy()
            self.barrier.wait()
            mean = self.mean(self.slots)
            self.barrier.wait()  # every rank has read every slot before one is written again
            g[...] = mean
            if r == 0:
                self.calls += 1

        return reduce

    def later_of_rank(self, r, where):
        """Rank `r`'s reduction, under way until the `wait()` of what it returns: done inside the wait
        ("in_wait"), or on a thread of the rank's, launch after launch, as gloo's all-reduce runs
        ("on_a_thread")."""
        reduce = self.of_rank(r)
        if where == "in_wait":
            return lambda g: SimpleNamespace(wait=lambda: reduce(g))
        pool = ThreadPoolExecutor(1)
        self.pools.append(pool)
        return lambda g: SimpleNamespace(wait=pool.submit(reduce, g).result)


# Two ranks share one fabric (as a node's ranks share its agent), each on its own batches; the last layers'
# steps on the CPU too, and micro-batches summed before the reduction; reductions done when they return, or
# finished later (as torch.distributed's with async_op=True).
@pytest.mark.parametrize("reduced", ["now", "in_wait", "on_a_thread"])
@pytest.mark.parametrize("micro_batches,on_host", [(1, 0), (2, 0), (2, 3)])
def test_ranks_whose_gradients_are_reduced_take_the_steps_of_the_mean_gradient(tmp_path, micro_batches, on_host, reduced):
    ranks = 2
    path = tmp_path / "ranks.toml"
    path.write_text(TIGHT.replace('gpu_budget = "2MiB"', 'gpu_budget = "6MiB"'))
    fabric = vfabric.Fabric(str(path))
    mean = ThreadMean(ranks)
    reduce = mean.of_rank if reduced == "now" else lambda r: mean.later_of_rank(r, reduced)
    runs = [Streamed(fabric, on_host, grad_reduce=reduce(r)) for r in range(ranks)]
    ref = Resident()
    steps, errors = 3, []

    def train(r):
        try:
            for step in range(steps):
                for k in range(micro_batches):
                    runs[r].micro(*batch(100 * r + 10 * step + k), k == micro_batches - 1)
            runs[r].stream.flush()
        except BaseException as e:
            errors.append(e)
            mean.barrier.abort()

    threads = [threading.Thread(target=train, args=(r,)) for r in range(ranks)]
    for t in threads:
        t.start()
    for step in range(steps):  # the reference: each rank's sums, their mean, one step
        sums = [None] * ranks
        for r in range(ranks):
            for k in range(micro_batches):
                sums[r] = Resident.add_up(sums[r], ref.gradients(*batch(100 * r + 10 * step + k))[1])
        ref.step([{k: ThreadMean.mean([s[i][k] for s in sums]) for k in sums[0][i]} for i in range(LAYERS)])
    for t in threads:
        t.join(timeout=120)
    for pool in mean.pools:
        pool.shutdown()
    assert not errors, errors
    assert mean.calls == steps * LAYERS, "one reduction a layer a step"
    for r in range(ranks):
        for i in range(LAYERS):
            got = master_of(runs[r].stream, i)
            for k, v in ref.master[i].items():
                assert np.array_equal(got[k], v.reshape(-1)), f"rank {r} layer {i} {k}"
        runs[r].stream.close()
    assert fabric.stats()["directory"]["regions"] == 0


class Later:
    """One rank's reduction (the identity) that finishes in the `wait()` of what it returns: logs each launch and
    each wait by the reduction's number, checks that its array stays as it was in between, and fails the wait
    of reduction `fail`."""

    def __init__(self, fail=None):
        self.log, self.fail = [], fail

    def __call__(self, g):
        n = sum(what == "launch" for what, _ in self.log)
        self.log.append(("launch", n))
        launched = g.copy()

        def wait():
            self.log.append(("wait", n))
            assert np.array_equal(g, launched), f"reduction {n}: its gradients changed before it was waited for"
            if n == self.fail:
                raise RuntimeError(f"reduction {n} failed")

        return SimpleNamespace(wait=wait)


def overlapped(steps):
    """The log of `steps` steps' reductions (a layer's a step, the last layer's first) when each is waited for
    once the next one is launched, and a step's last one before the next step's first is launched."""
    log = []
    for n in range(steps * LAYERS):
        log.append(("launch", n))
        if n % LAYERS:
            log.append(("wait", n - 1))
        if n % LAYERS == LAYERS - 1:
            log.append(("wait", n))
    return log


# On the tight device; on a roomier one with steps on the CPU and micro-batches (room enough whatever the CPU's
# timing); and on a device so small that a part of the last layer's states finds no run of frames until the
# pending layers let theirs go (a flush inside a deferred step).
@pytest.mark.parametrize("budget,micro_batches,on_host", [("2MiB", 1, 0), ("6MiB", 2, 3), ("1280KiB", 1, 0)])
def test_a_layers_reduction_is_waited_for_once_the_next_layers_is_under_way(tmp_path, budget, micro_batches, on_host):
    path = tmp_path / "stream.toml"
    path.write_text(TIGHT.replace('gpu_budget = "2MiB"', f'gpu_budget = "{budget}"'))
    fabric = vfabric.Fabric(str(path))
    later = Later()
    ref, run = Resident(), Streamed(fabric, on_host, grad_reduce=later)
    for step in range(3):
        for k in range(micro_batches):
            x, t = batch(10 * step + k)
            last = k == micro_batches - 1
            assert run.micro(x, t, last) == ref.micro(x, t, last), f"step {step} micro-batch {k}"
    s = run.stream
    assert s.steps(0) == 3, "the first layer's step waits for its reduction, then counts"
    s.flush()
    assert later.log == overlapped(3)
    assert (s.flushed_for_runs > 0) == (budget == "1280KiB"), s.flushed_for_runs
    for i in range(LAYERS):
        assert s.steps(i) == 3
        got = master_of(s, i)
        for k, v in ref.master[i].items():
            assert np.array_equal(got[k], v.reshape(-1)), f"layer {i} {k}"
    s.close()
    assert fabric.stats()["directory"]["regions"] == 0


# A middle layer's reduction fails in the next layer's backward_done; the last one's in the flush after the pass.
@pytest.mark.parametrize("fail", [2, LAYERS - 1])
def test_a_reduction_that_fails_raises_in_the_call_that_waits_for_it(tight, fail):
    later = Later(fail)
    run = Streamed(tight, grad_reduce=later)
    s = run.stream
    if fail < LAYERS - 1:
        with pytest.raises(RuntimeError, match=f"reduction {fail} failed"):
            run.micro(*batch(0), True)
        assert later.log[-2:] == [("launch", fail + 1), ("wait", fail)], "raised once the next one was launched"
    else:
        run.micro(*batch(0), True)
        with pytest.raises(RuntimeError, match=f"reduction {fail} failed"):
            s.flush()
    s.close()  # finishes the reduction launched after the failed one; the failed layer's leases were let go
    assert later.log.count(("wait", fail)) == 1, "a failed reduction is not waited for again"
    assert later.log[-1] == ("wait", min(fail + 1, LAYERS - 1)), later.log
    stats = tight.stats()["directory"]
    assert stats["leases"] == 0 and stats["regions"] == 0, stats


def test_the_cpus_share_is_not_balanced_under_data_parallelism(tight):
    # Each rank would choose its own share from its own timings, and their weights would drift apart.
    s = Streamed(tight, on_host=2, grad_reduce=lambda g: None).stream
    with pytest.raises(ValueError, match="data parallelism"):
        s.balance_host_layers()
    assert s.balance is None
    s.close()


# The CPU's share changed between steps (by hand, and by the balance from what the steps measured).
@pytest.mark.parametrize("shares", [(3, 1, 5, 0), (6, 0, 6, 2), "auto"])
def test_the_cpus_share_changes_between_steps_and_the_numbers_stay_the_resident_models(tight, shares):
    ref, run = Resident(), Streamed(tight, on_host=3 if shares == "auto" else shares[0])
    s = run.stream
    if shares == "auto":
        s.balance_host_layers()
    for step in range(4):
        if shares != "auto":
            s.set_host_layers(shares[step])
            assert s.host_layers() == shares[step]
        for k in range(2):
            x, t = batch(10 * step + k)
            assert run.micro(x, t, k == 1) == ref.micro(x, t, k == 1), f"step {step} micro-batch {k}"
            if k == 0:
                with pytest.raises(ValueError, match="between optimizer steps"):
                    s.set_host_layers(2)  # gradient sums are held
    s.flush()
    for i in range(LAYERS):
        got = master_of(s, i)
        for k, v in ref.master[i].items():
            assert np.array_equal(got[k], v.reshape(-1)), f"layer {i} {k}"
    if shares == "auto":
        assert s.balance is not None and len(s.balance.history) >= 1, "the balance judged steps"
    with pytest.raises(ValueError, match="between 0 and the 6 layers"):
        s.set_host_layers(7)
    s.close()


def test_a_view_kept_past_its_layer_stops_the_stream_with_lease_in_use(tight):
    run = Streamed(tight)
    s = run.stream
    kept = s.forward_weights(0)["a"]
    s.forward_done(0)
    s.forward_weights(1)
    with pytest.raises(vfabric.LeaseInUse):
        s.forward_done(1)  # retires layer 0, whose compute copy `kept` still points into
    del kept
    s.flush()
    assert tight.stats()["directory"]["leases"] == 0


def test_layouts_put_parts_on_pages_and_refuse_what_they_cannot_hold():
    from vfabric.stream_layout import LayerLayout, Part, Piece

    page = 64 << 10
    lay = LayerLayout(specs(), page, piece_bytes=192 << 10)
    # Matrices a page-aligned part each, the vector in the last part.
    assert lay.parts == [Part(0, D * H * 2), Part(page, H * D * 2), Part(2 * page, 512)]  # vectors 512-byte aligned
    assert lay.compute == [(0, 0), (1, 0), (2, 0)] and lay.compute_bytes == 3 * page
    assert lay.flat == [0, D * H, 2 * D * H] and lay.numel == 2 * D * H + D
    # Pieces of 16384 parameters: 3 pages of states, 1 of gradients, each starting on a page.
    assert lay.pieces == [Piece(0, 16384), Piece(16384, 16384), Piece(32768, 64)]
    assert [lay.state_part(k) for k in range(3)] == [Part(0, 3 * page), Part(3 * page, 3 * page), Part(6 * page, 768)]
    assert lay.grad_part(2) == Part(2 * page, 256)
    assert lay.overlaps(1) == [(1, 0, 16384)] and lay.overlaps(2) == [(2, 0, 64)]
    assert LayerLayout(specs(), page, piece_bytes=1).piece_numel == page // 4, "at least a page of gradients"
    with pytest.raises(ValueError, match="compute dtype"):
        LayerLayout([ParamSpec("x", (3,), "int8")], page)
    with pytest.raises(ValueError, match="at least one"):
        LayerLayout([], page)
