"""DiskOffload: tensors in a file between their uses, read back byte for byte."""

import pytest
import torch

from rllib_search.algos.learners.disk_offload import DiskOffload, optimizer_state_slots, parameter_slots


def test_a_module_read_back_from_the_file_is_the_same_and_fails_loudly_while_offloaded():
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(16, 8), torch.nn.Linear(8, 16))
    module[1].weight = module[0].weight  # tied, as a language model's embeddings and output projection
    module[1].bias.data = module[1].bias.data.to(torch.bfloat16)
    before = {name: tensor.clone() for name, tensor in module.state_dict().items()}
    offload = DiskOffload(lambda: parameter_slots(module), frozen=True)
    freed = offload.offload()
    assert freed == 16 * 8 * 4 + 16 * 2  # the tied weight once; the bf16 bias in its own width
    assert offload.offloaded and not any(p.numel() for p in module.parameters())
    with pytest.raises(RuntimeError):
        module(torch.tensor([1]))
    for _ in range(2):  # frozen: written once, read back each time
        with offload.loaded():
            assert module[1].weight is module[0].weight
            for name, tensor in module.state_dict().items():
                assert tensor.dtype == before[name].dtype and torch.equal(tensor, before[name])
        assert offload.offloaded
    offload.close()
    assert all(torch.equal(tensor, before[name]) for name, tensor in module.state_dict().items())


def test_optimizer_moments_are_written_at_each_offload_and_a_new_state_is_not_overwritten():
    param = torch.nn.Parameter(torch.randn(4, 4))
    optimizer = torch.optim.AdamW([param])
    offload = DiskOffload(lambda: optimizer_state_slots([optimizer]))
    assert offload.offload() == 0  # no state before the first step
    for _ in range(2):
        offload.load()
        param.grad = torch.randn(4, 4)
        optimizer.step()
        kept = {key: value.clone() for key, value in optimizer.state[param].items()}
        offload.offload()
        assert optimizer.state[param]["exp_avg"].numel() == 0 and optimizer.state[param]["step"].dim() == 0
        offload.load()
        assert all(torch.equal(optimizer.state[param][key], value) for key, value in kept.items())
        offload.offload()
    restored = {key: value.clone() for key, value in kept.items()}
    optimizer.load_state_dict({**optimizer.state_dict(), "state": {0: restored}})
    offload.discard()
    offload.load()  # nothing to read: the loaded state stays as it was loaded
    assert all(torch.equal(optimizer.state[param][key], value) for key, value in restored.items())
