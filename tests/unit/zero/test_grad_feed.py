"""Gradients fed to the CPU Adam a chunk at a time (stages/grad_feed.py) give the same update as
gradients held whole in ``.grad``; stage 3 with optimizer offload keeps them in the device buffer."""
import pytest
import torch

from launcher.zero.optim.cpu_adam import CPUAdam
from launcher.zero.stages.grad_feed import GradFeed


@pytest.fixture(autouse=True)
def no_process_group_left():
    yield
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def _adam(params, **kwargs):
    return CPUAdam(params, lr=1e-2, betas=(0.9, 0.99), weight_decay=0.1, chunk_elements=7, **kwargs)


@pytest.mark.parametrize("source_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reorder", [False, True])
def test_fed_chunks_update_like_whole_gradients(source_dtype, reorder):
    torch.manual_seed(0)
    start = [torch.randn(50), torch.randn(23)]
    grads = [[torch.randn(t.numel()).to(source_dtype) for t in start] for _ in range(3)]
    whole = [t.clone() for t in start]
    fed = [t.clone() for t in start]
    reference, optimizer = _adam(whole), _adam(fed)
    if reorder:   # the last chunks first: the feed must follow the Adam's order, not the buffer's
        for adam in (reference, optimizer):
            adam.chunk_priority = lambda param, a, b: -a
    feed = GradFeed(torch.device("cpu"), optimizer.chunk_elements, pin=False, depth=3)
    optimizer.grad_feed = feed
    sources = [torch.zeros(t.numel(), dtype=source_dtype) for t in start]
    feed.use(fed, sources)
    for step_grads in grads:
        for master, grad in zip(whole, step_grads):
            master.grad = grad.float()
        for master, source, grad in zip(fed, sources, step_grads):
            source.copy_(grad)
            master.grad = torch.zeros(1).expand(master.numel())   # a mark: the feed has the values
        reference.grad_factor = optimizer.grad_factor = 0.5        # unscale/clip applied as read
        feed.arm()
        reference.step()
        optimizer.step()
    for a, b in zip(whole, fed):
        assert torch.equal(a, b)
    assert not torch.equal(whole[0], start[0])


def test_a_master_the_feed_does_not_serve_steps_from_its_own_grad():
    """offload_optimizer.ratio: a master kept on the device holds its real gradient in ``.grad``
    while the feed serves the offloaded ones; one CPU Adam steps both, with the same factor."""
    torch.manual_seed(0)
    start = [torch.randn(50), torch.randn(23)]
    grads = [[torch.randn(t.numel()) for t in start] for _ in range(3)]
    whole, mixed = [t.clone() for t in start], [t.clone() for t in start]
    reference, optimizer = _adam(whole), _adam(mixed)
    feed = GradFeed(torch.device("cpu"), optimizer.chunk_elements, pin=False, depth=2)
    optimizer.grad_feed = feed
    source = torch.zeros(start[1].numel())
    feed.use([mixed[1]], [source])
    assert feed.feeds(mixed[1]) and not feed.feeds(mixed[0])
    for step_grads in grads:
        for master, grad in zip(whole, step_grads):
            master.grad = grad.clone()
        mixed[0].grad = step_grads[0].clone()                     # kept: its own gradient
        source.copy_(step_grads[1])
        mixed[1].grad = torch.zeros(1).expand(mixed[1].numel())   # fed: a mark
        reference.grad_factor = optimizer.grad_factor = 0.5
        feed.arm()
        reference.step()
        optimizer.step()
    for a, b in zip(whole, mixed):
        assert torch.equal(a, b)
    assert not torch.equal(whole[0], start[0])


def test_feed_slots_are_reused_only_after_their_chunk():
    feed = GradFeed(torch.device("cpu"), chunk_numel=4, pin=False, depth=2)
    master = torch.zeros(16)
    source = torch.arange(16.0)
    feed.use([master], [source])
    spans = [(master, a, a + 4) for a in range(0, 16, 4)]
    feed.begin(spans)
    seen = []
    for index in range(4):
        seen.append(feed.take(index).clone())
        feed.done(index)
    assert [s.tolist() for s in seen] == [source[a:a + 4].tolist() for a in range(0, 16, 4)]


def _stage3_engine(gas: int, overlap: bool):
    from launcher import zero
    from tests.helpers.gpt import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_embd=32, n_head=4, seq_len=8, vocab_size=64))
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas,
              "bf16": {"enabled": True}, "gradient_clipping": 1.0, "steps_per_print": 10**9,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0,
                                    "offload_optimizer": {"device": "cpu", "overlap_step": overlap}},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
    engine, _, _, _ = zero.initialize(model=model, config=config)
    return engine


@pytest.mark.parametrize("gas, dtype", [(1, torch.bfloat16), (2, torch.float32)])
def test_stage3_offload_keeps_gradients_in_the_device_buffer(gas, dtype):
    engine = _stage3_engine(gas, overlap=False)
    try:
        strategy = engine.strategy
        assert strategy.device_grads and strategy.feed is engine.basic_optimizer.grad_feed
        # one micro-step a step keeps the gradients in bf16 (nothing adds up); accumulation in fp32
        assert {g.dtype for g in strategy.grads} == {dtype}
        assert all(g.device == strategy.context.dist_context.device for g in strategy.grads)
    finally:
        engine.destroy()
        torch.distributed.destroy_process_group()
    background = _stage3_engine(1, overlap=True)   # the background step reads two host buffers
    try:
        assert not background.strategy.device_grads and background.strategy.feed is None
    finally:
        background.destroy()
