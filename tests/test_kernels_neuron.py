"""The Neuron path of the operators, against a fake `torch_neuronx` / nkilib installed by the test.

No Trainium is reachable here and the real wheels cannot be installed, so this checks the contract
the code is written against (see qwen3exp/kernels/neuron.py): the kernels receive the documented
layouts (rope_hf: [B, H, S, D] and a packed [S, 2D] or [B, S, 2D] cache; moe_cte /
blockwise_mm_bwd: [T+1, H], [(T+1)*E, 1], [E, H, 2, I], [E, I, H], [N*B], [N, 1]), every launch is
`wrap_nki(kernel)[lnc]` with the LNC of the environment, and the constraints are enforced before a
kernel is called. The fakes compute with plain loops in the kernels' own layouts (independent of
the PyTorch implementations), so the results are compared with the CPU path as well.
"""

from __future__ import annotations

import enum
import sys
import types
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from qwen3exp.kernels import neuron
from qwen3exp.kernels.moe_blockwise import moe_blockwise, route
from qwen3exp.kernels.rope import rope


class Launches(list):
    """(kernel name, grid, args, kwargs) of every launch."""


class FakeKernel:
    def __init__(self, name, fn, launches):
        self.name, self.fn, self.launches = name, fn, launches

    def __getitem__(self, grid):  # kernel[lnc]: the pitfall (silently LNC=1 on the real stack)
        raise AssertionError(f"{self.name}[{grid}] used: the grid must index wrap_nki(kernel), not the kernel")

    def __call__(self, *args, **kwargs):
        raise AssertionError(f"{self.name} called directly, not through wrap_nki")


class Wrapped:
    def __init__(self, kernel: FakeKernel):
        self.kernel = kernel

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.kernel.launches.append((self.kernel.name, grid, args, kwargs))
            return self.kernel.fn(*args, **kwargs)

        return launch

    def __call__(self, *args, **kwargs):  # wrap_nki(k)(...) without a grid: LNC=1
        self.kernel.launches.append((self.kernel.name, None, args, kwargs))
        return self.kernel.fn(*args, **kwargs)


# ------------------------------------------------------------------------ fake nkilib kernels
def _fake_rope_hf(q, k, q_out, k_out, cos=None, sin=None, rope_cache=None, backward=False):
    assert cos is None and sin is None and rope_cache is not None
    D = q.shape[-1]
    c = rope_cache[None, None] if rope_cache.dim() == 2 else rope_cache[:, None]  # -> [B|1, 1, S, 2D]
    cos_, sin_ = c[..., :D], c[..., D:]
    for x, out in ((q, q_out), (k, k_out)):
        lo, hi = x[..., : D // 2], x[..., D // 2 :]
        if backward:
            out.copy_(x * cos_ + torch.cat((hi * sin_[..., D // 2 :], -lo * sin_[..., : D // 2]), -1))
        else:
            out.copy_(x * cos_ + torch.cat((-hi * sin_[..., : D // 2], lo * sin_[..., D // 2 :]), -1))
    return q_out, k_out


def _blocks(hidden, affinities, gate_up, down, positions, block_to_expert, block_size):
    """Per-block loop in nkilib's layouts: yields (block, slot tokens, expert, gate, up, down_act, aff)."""
    T1, H = hidden.shape
    E = gate_up.shape[0]
    aff = affinities.view(T1, E)
    for n, e in enumerate(block_to_expert.view(-1).tolist()):
        tok = positions[n * block_size : (n + 1) * block_size].long()
        x = hidden[tok].float()
        gate, up = x @ gate_up[e, :, 0].float(), x @ gate_up[e, :, 1].float()
        d = (F.silu(gate) * up) @ down[e].float()
        yield n, tok, e, gate, up, d, aff[tok, e].float()


def _fake_moe_cte(hidden, affinities, gate_up, down, positions, block_to_expert, block_size, spec, **kw):
    assert spec.implementation is MoECTEImplementation.shard_on_i and spec.shard_on_I.checkpoint_activation
    assert block_to_expert.shape == (block_to_expert.shape[0], 1)
    N, (_E, H, _, I) = block_to_expert.shape[0], gate_up.shape
    out = torch.zeros(hidden.shape, dtype=torch.float32)
    gu_t = torch.zeros(N, 2, I, block_size)
    d_act = torch.zeros(N, block_size, H)
    for n, tok, _, gate, up, d, a in _blocks(hidden, affinities, gate_up, down, positions, block_to_expert, block_size):
        out.index_add_(0, tok, d * a[:, None])
        gu_t[n, 0], gu_t[n, 1], d_act[n] = gate.T, up.T, d
    out[-1] = 0  # the padding row
    return out.to(hidden.dtype), gu_t.to(gate_up.dtype), d_act.to(gate_up.dtype)


def _fake_bwd(
    hidden,
    affinities,
    gate_up,
    down,
    gate_up_t,
    down_act,
    positions,
    block_to_expert,
    grad_out,
    block_size,
    affinity_option=None,
    kernel_type_option=None,
    **kw,
):
    assert affinity_option is AffinityOption.AFFINITY_ON_H and kernel_type_option is KernelTypeOption.DROPLESS
    N = block_to_expert.shape[0]
    assert gate_up_t.shape == (N, 2, gate_up.shape[-1], block_size)
    assert down_act.shape == (N, block_size, hidden.shape[1])
    # Per block, by hand (autograd is not available below the operator's autograd layer).
    E, H, _, I = gate_up.shape
    g_hidden, g_aff = torch.zeros(hidden.shape), torch.zeros(hidden.shape[0], E)
    g_gate_up, g_down = torch.zeros(E, H, 2, I), torch.zeros(E, I, H)
    for _, tok, e, gate, up, d, a in _blocks(hidden, affinities, gate_up, down, positions, block_to_expert, block_size):
        g = grad_out[tok].float()
        g_aff[tok, e] += (g * d).sum(-1)
        gd = g * a[:, None]
        sig = torch.sigmoid(gate)
        g_down[e] += (gate * sig * up).T @ gd
        dh = gd @ down[e].float().T
        d_gate = dh * up * sig * (1 + gate * (1 - sig))
        d_up = dh * gate * sig
        x = hidden[tok].float()
        g_gate_up[e, :, 0] += x.T @ d_gate
        g_gate_up[e, :, 1] += x.T @ d_up
        g_hidden.index_add_(0, tok, d_gate @ gate_up[e, :, 0].float().T + d_up @ gate_up[e, :, 1].float().T)
    g_hidden[-1] = 0
    g_aff[-1] = 0
    grads = (g_hidden, g_aff.view(-1, 1), g_gate_up, g_down)
    return tuple(g.to(t.dtype) for g, t in zip(grads, (hidden, affinities, gate_up, down), strict=True))


class MoECTEImplementation(enum.Enum):
    shard_on_block = 0
    shard_on_i = 1


@dataclass
class ShardOnIConfig:
    checkpoint_activation: bool = False
    expert_affinity_multiply_on_I: bool = False


@dataclass
class MoECTESpec:
    implementation: MoECTEImplementation
    shard_on_I: ShardOnIConfig | None = None


class AffinityOption(enum.Enum):
    AFFINITY_ON_H = 0
    AFFINITY_ON_I = 1


class KernelTypeOption(enum.Enum):
    DROPLESS = 0
    DROPPING = 1


@pytest.fixture
def fake_neuron(monkeypatch):
    launches = Launches()

    def module(name, **attrs):
        m = types.ModuleType(name)
        for k, v in attrs.items():
            setattr(m, k, v)
        monkeypatch.setitem(sys.modules, name, m)
        return m

    module("torch_neuronx", wrap_nki=lambda kernel: Wrapped(kernel))
    for pkg in (
        "nkilib",
        "nkilib.core",
        "nkilib.core.embeddings",
        "nkilib.core.moe",
        "nkilib.core.moe.moe_cte",
        "nkilib.experimental",
        "nkilib.experimental.moe",
        "nkilib.experimental.moe.bwd",
    ):
        module(pkg)
    module("nkilib.core.embeddings.rope_hf", rope_hf=FakeKernel("rope_hf", _fake_rope_hf, launches))
    module(
        "nkilib.core.moe.moe_cte.moe_cte",
        moe_cte=FakeKernel("moe_cte", _fake_moe_cte, launches),
        MoECTESpec=MoECTESpec,
        MoECTEImplementation=MoECTEImplementation,
        ShardOnIConfig=ShardOnIConfig,
    )
    module(
        "nkilib.experimental.moe.bwd.blockwise_mm_backward",
        blockwise_mm_bwd=FakeKernel("blockwise_mm_bwd", _fake_bwd, launches),
    )
    module(
        "nkilib.experimental.moe.bwd.moe_bwd_parameters",
        AffinityOption=AffinityOption,
        KernelTypeOption=KernelTypeOption,
    )
    assert neuron.available()
    # CPU tensors stand in for Neuron tensors: route the operators to their Neuron implementation.
    monkeypatch.setattr(neuron, "on_neuron", lambda t: neuron.available())
    monkeypatch.setenv(neuron.LNC_ENV, "2")
    return launches


def test_without_the_packages_the_bridge_is_off():
    assert not neuron.available()  # this machine has no Neuron wheels
    assert not neuron.on_neuron(torch.zeros(1))


# ------------------------------------------------------------------------------------- RoPE
def _rope_inputs(B=2, S=256, Hq=3, Hk=1, D=8):
    from torchtitan.models.common import CosSinRoPE

    torch.manual_seed(0)
    cache = CosSinRoPE.Config(dim=D, max_seq_len=512, theta=1e6).build().cache
    q = torch.randn(B, S, Hq, D, requires_grad=True)
    k = torch.randn(B, S, Hk, D, requires_grad=True)
    return q, k, cache


@pytest.mark.parametrize("lnc", [1, 2])
def test_rope_calls_rope_hf_with_hf_layout_and_the_lnc_grid(fake_neuron, monkeypatch, lnc):
    monkeypatch.setenv(neuron.LNC_ENV, str(lnc))
    q, k, cache = _rope_inputs()
    oq, ok = rope(q, k, cache[:256])
    ((name, grid, args, kwargs),) = fake_neuron
    assert name == "rope_hf" and grid == lnc
    q_in, k_in, q_out, k_out = args
    assert q_in.shape == (2, 3, 256, 8) and k_in.shape == (2, 1, 256, 8)  # [B, H, S, D]
    assert q_in.is_contiguous() and q_out.shape == q_in.shape and k_out.shape == k_in.shape
    assert kwargs["rope_cache"].shape == (256, 16) and kwargs["backward"] is False  # packed [S, 2D]
    assert torch.equal(kwargs["rope_cache"], cache[:256])
    from qwen3exp.kernels.rope import rope_pytorch

    want_q, want_k = rope_pytorch(q, k, cache[:256])
    assert oq.shape == q.shape and torch.allclose(oq, want_q, atol=1e-6) and torch.allclose(ok, want_k, atol=1e-6)
    # backward: the same kernel with backward=True, the saved cache, the same grid
    (oq.sum() + 2 * ok.sum()).backward()
    name, grid, args, kwargs = fake_neuron[1]
    assert name == "rope_hf" and grid == lnc and kwargs["backward"] is True
    assert args[0].shape == (2, 3, 256, 8) and kwargs["rope_cache"].shape == (256, 16)
    ref_q, ref_k = q.detach().clone().requires_grad_(), k.detach().clone().requires_grad_()
    rq, rk = rope_pytorch(ref_q, ref_k, cache[:256])
    (rq.sum() + 2 * rk.sum()).backward()
    assert torch.allclose(q.grad, ref_q.grad, atol=1e-6) and torch.allclose(k.grad, ref_k.grad, atol=1e-6)


def test_rope_per_sample_cache_is_batched(fake_neuron):
    q, k, cache = _rope_inputs()
    positions = torch.stack([torch.arange(256), torch.arange(256).remainder(100)])
    rope(q, k, cache[positions])
    assert fake_neuron[0][3]["rope_cache"].shape == (2, 256, 16)  # [B, S, 2D]


@pytest.mark.parametrize("lnc,seq,ok", [(2, 128, False), (2, 384, False), (2, 512, True), (1, 128, True)])
def test_rope_sequence_length_constraint(fake_neuron, monkeypatch, lnc, seq, ok):
    monkeypatch.setenv(neuron.LNC_ENV, str(lnc))
    q, k, cache = _rope_inputs(S=seq)
    if ok:
        rope(q, k, cache[:seq])
        assert fake_neuron[0][1] == lnc
    else:
        with pytest.raises(neuron.NeuronKernelError, match=rf"multiple of 128 x LNC = {128 * lnc}"):
            rope(q, k, cache[:seq])
        assert not fake_neuron  # refused before any launch


def test_lnc_from_environment():
    assert neuron.lnc_from_env({}) == 2
    assert neuron.lnc_from_env({neuron.LNC_ENV: "1"}) == 1
    with pytest.raises(neuron.NeuronKernelError):
        neuron.lnc_from_env({neuron.LNC_ENV: "4"})


# -------------------------------------------------------------------------------------- MoE
def _moe_inputs(T=300, H=16, I=8, E=4, B=128):
    torch.manual_seed(0)
    ids = torch.stack([torch.where(torch.arange(T) < 200, 0, 1), torch.full((T,), 2)], 1)  # expert 3 empty
    scores = torch.rand(T, 2)
    r = route(
        torch.arange(T).repeat_interleave(2),
        ids.reshape(-1),
        scores.reshape(-1),
        num_tokens=T,
        num_experts=E,
        block_size=B,
    )
    hidden = torch.cat([torch.randn(T, H), torch.zeros(1, H)]).requires_grad_()
    aff = r.affinities.clone().requires_grad_()
    gate_up = (torch.randn(E, H, 2, I) * 0.3).requires_grad_()
    down = (torch.randn(E, I, H) * 0.3).requires_grad_()
    return r, hidden, aff, gate_up, down


def test_moe_calls_moe_cte_and_blockwise_mm_bwd_with_their_layouts(fake_neuron):
    r, hidden, aff, gate_up, down = _moe_inputs()
    N = r.block_to_expert.shape[0]
    out, gu_t, d_act = moe_blockwise(hidden, aff, gate_up, down, r.token_position_to_id, r.block_to_expert, 128)
    ((name, grid, args, kwargs),) = fake_neuron
    assert name == "moe_cte" and grid == 2
    h, a, gu, dn, pos, b2e, bs, spec = args
    assert h.shape == (301, 16) and a.shape == (301 * 4, 1) and gu.shape == (4, 16, 2, 8) and dn.shape == (4, 8, 16)
    assert pos.shape == (N * 128,) and b2e.shape == (N, 1) and bs == 128
    assert gu_t.shape == (N, 2, 8, 128) and d_act.shape == (N, 128, 16)
    # the same numbers as the PyTorch implementation
    from qwen3exp.kernels.moe_pytorch import moe_forward_pytorch

    want = moe_forward_pytorch(
        hidden.detach(), aff.detach(), gate_up.detach(), down.detach(), r.token_position_to_id, r.block_to_expert, 128
    )
    for got, ref in zip((out, gu_t, d_act), want, strict=True):
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    grad = torch.randn_like(out)
    out.backward(grad)
    name, grid, args, kwargs = fake_neuron[1]
    assert name == "blockwise_mm_bwd" and grid == 2
    assert args[4].shape == (N, 2, 8, 128) and args[5].shape == (N, 128, 16) and args[7].shape == (N, 1)
    assert args[8].shape == (301, 16) and args[9] == 128
    from qwen3exp.kernels.moe_pytorch import moe_backward_pytorch

    ref = moe_backward_pytorch(
        grad,
        hidden.detach(),
        aff.detach(),
        gate_up.detach(),
        down.detach(),
        *want[1:],
        r.token_position_to_id,
        r.block_to_expert,
        128,
    )
    for got, want_grad in zip((hidden.grad, aff.grad, gate_up.grad, down.grad), ref, strict=True):
        torch.testing.assert_close(got, want_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block,lnc,H,message", [(64, 2, 16, "block sizes"), (128, 2, 15, "not divisible")])
def test_moe_constraints(fake_neuron, monkeypatch, block, lnc, H, message):
    monkeypatch.setenv(neuron.LNC_ENV, str(lnc))
    r, hidden, aff, gate_up, down = _moe_inputs(T=40, H=H, B=block)
    with pytest.raises(neuron.NeuronKernelError, match=message):
        moe_blockwise(hidden, aff, gate_up, down, r.token_position_to_id, r.block_to_expert, block)
    assert not fake_neuron


# ------------------------------------------------------------------- pre-launch checks on Neuron
def _neuron_facts(lnc: str | None):
    from qwen3exp.platforms import PlatformFacts

    return PlatformFacts(
        name="neuron",
        reason="test",
        device_type="neuron",
        dist_backend="neuron",
        ranks_per_node=64,
        memory_per_rank_bytes=24 * 2**30,
        attention="sdpa",
        compile_backend="neuron",
        peak_flops_per_rank=158e12,
        env={} if lnc is None else {neuron.LNC_ENV: lnc},
    )


@pytest.mark.parametrize("lnc,seq_len,ok", [(None, 128, False), ("2", 256, True), ("1", 128, True), ("2", 384, False)])
def test_prelaunch_neuron_seq_len_for_nki_rope(monkeypatch, lnc, seq_len, ok):
    from conftest import compose
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.errors import ConfigError
    from qwen3exp.titan import overrides

    monkeypatch.delenv(neuron.LNC_ENV, raising=False)
    exp = validate_experiment(compose("kernels=nki_rope", f"training.seq_len={seq_len}"))
    built = []
    if ok:
        overrides.check(exp, _neuron_facts(lnc), lambda: built.append(1) or _trainer_config(exp))
        return
    with pytest.raises(ConfigError) as e:
        overrides.check(exp, _neuron_facts(lnc), lambda: built.append(1))
    (p,) = e.value.problems
    assert p.key == "training.seq_len" and p.value == seq_len and "128 x LNC" in p.message
    assert not built  # refused without building anything


def test_prelaunch_neuron_moe_block_size(monkeypatch):
    from conftest import compose
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.errors import ConfigError
    from qwen3exp.titan import overrides

    exp = validate_experiment(compose("kernels=nki_moe", "model.flavor=tiny_moe", "kernels.moe.block_size=100"))
    with pytest.raises(ConfigError) as e:
        overrides.check(exp, _neuron_facts("2"), lambda: None)
    assert [p.key for p in e.value.problems] == ["kernels.moe.block_size"]


def _trainer_config(exp):
    from pathlib import Path

    from qwen3exp.config.sections.platform import CpuPlatform
    from qwen3exp.platforms.cpu import facts as cpu_facts
    from qwen3exp.titan.job_config import to_torchtitan

    return to_torchtitan(exp, cpu_facts(CpuPlatform(), nproc_per_node=None, reason="test"), Path("/tmp/x"))
