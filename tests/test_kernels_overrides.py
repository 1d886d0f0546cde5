"""kernels=nki_rope / nki_moe / kernels.overrides: composition, the pre-launch checks (computed on the
config tree, no model built), what torchtitan then applies, and the model reductions they rely on."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO, compose, run_cli
from qwen3exp.errors import ConfigError
from qwen3exp.kernels import registry
from qwen3exp.kernels.nki_moe import FACTORY as NKI_MOE
from qwen3exp.kernels.nki_rope import FACTORY as NKI_ROPE
from qwen3exp.titan import overrides

EXAMPLES = REPO / "examples"


@pytest.fixture
def examples_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLES))


def _prepare(*ovr: str):
    from qwen3exp.config.schema import validate_experiment
    from qwen3exp.launchers.local import prepare

    return prepare(validate_experiment(compose(*ovr)))


def _problems(*ovr: str) -> list:
    with pytest.raises(ConfigError) as e:
        _prepare(*ovr)
    return e.value.problems


# ------------------------------------------------------------------------------- composition
def test_groups_select_the_builtin_overrides():
    from qwen3exp.config.schema import validate_experiment

    rope = validate_experiment(compose("kernels=nki_rope")).kernels
    assert (rope.name, rope.rope.impl, rope.moe.impl, rope.overrides) == ("nki_rope", "nki", "torchtitan", [])
    moe = validate_experiment(compose("kernels=nki_moe", "model.flavor=tiny_moe")).kernels
    assert (moe.moe.impl, moe.moe.block_size, moe.rope.impl) == ("nki", 128, "torchtitan")
    assert [a.target for a in overrides.activations(moe)] == [NKI_MOE]
    assert overrides.activations(validate_experiment(compose()).kernels) == []


def test_each_builtin_override_is_one_module_found_by_its_section():
    import importlib

    from torchtitan.config.override import _REGISTRY

    assert {k: m.__name__ for k, m in registry.BY_KEY.items()} == {
        "kernels.rope": "qwen3exp.kernels.nki_rope",
        "kernels.moe": "qwen3exp.kernels.nki_moe",
    }
    for m in registry.OVERRIDES:  # the torchtitan factory claims the nodes its module says
        importlib.import_module(m.FACTORY.rpartition(".")[0])
        assert _REGISTRY[m.FACTORY].fqns == m.DEFAULT_FQNS


def test_plain_experiments_do_not_import_torchtitan_to_validate():
    code = (
        "import sys; sys.path.insert(0, 'tests'); from conftest import compose; "
        "from qwen3exp.config.schema import validate_experiment; from qwen3exp.launchers.local import prepare; "
        "p = prepare(validate_experiment(compose())); assert p.overrides == []; "
        "assert 'torchtitan' not in sys.modules and 'torch' not in sys.modules, 'imported'"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr


def test_torchtitan_config_lists_the_imports(tmp_path):
    from qwen3exp.titan.job_config import to_torchtitan

    prep = _prepare("kernels=nki_moe", "model.flavor=tiny_moe", "kernels.rope.impl=nki", "kernels.moe.block_size=256")
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    assert config.override.imports == [NKI_ROPE, (NKI_MOE, {"block_size": 256})]


# --------------------------------------------------------------------------- pre-launch claims
def test_nki_rope_claims_one_node_per_layer():
    (claim,) = _prepare("kernels=nki_rope").overrides
    assert claim["target"] == NKI_ROPE and claim["replaces"] == "CosSinRoPE.Config"
    assert claim["nodes"] == [f"model_spec.model.layers.{i}.attention.rope" for i in range(2)]


def test_fqns_limit_the_override_to_chosen_layers(tmp_path):
    """kernels.rope.fqns narrows the selection; torchtitan then replaces exactly those nodes."""
    from torchtitan.config.override import apply_overrides
    from torchtitan.models.common import CosSinRoPE

    from qwen3exp.titan.job_config import to_torchtitan
    from qwen3exp.titan.nki_rope import NKIRoPE

    prep = _prepare("kernels=nki_rope", "model.n_layers=2", "kernels.rope.fqns=[model_spec.model.layers.1.*]")
    (claim,) = prep.overrides
    assert claim["nodes"] == ["model_spec.model.layers.1.attention.rope"]
    assert claim["import_name"].startswith("qwen3exp.titan.overrides.nki_rope__")
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    lines = apply_overrides(config.override, config)
    assert len(lines) == 1 and "layers.1.attention.rope" in lines[0]
    layers = config.model_spec.model.layers
    assert type(layers[0].attention.rope) is CosSinRoPE.Config and type(layers[1].attention.rope) is NKIRoPE.Config


def test_override_matching_no_node_is_an_error():
    # torchtitan's docstring pattern without the model_spec.model. prefix matches nothing
    (p,) = _problems("kernels=nki_rope", "kernels.rope.fqns=[layers.*.attention.rope]")
    assert p.key == "kernels.rope.fqns" and p.value == ["layers.*.attention.rope"]
    assert "matches no node" in p.message and "model_spec.model.layers.0.attention.rope" in p.allowed


def test_two_overrides_claiming_one_node_name_both():
    problems = _problems(
        "kernels=nki_rope",
        f"kernels.overrides=[{{target: {NKI_ROPE}, fqns: [model_spec.model.layers.0.attention.rope]}}]",
    )
    (p,) = problems
    assert p.key == "kernels.overrides.0" and "kernels.rope" in p.message and NKI_ROPE in p.message
    assert "model_spec.model.layers.0.attention.rope" in p.message


def test_nested_claims_are_a_conflict(tmp_path, monkeypatch):
    # an override of a whole attention block vs nki_rope on its rope: order-dependent in torchtitan
    (tmp_path / "attention_kernels.py").write_text(
        "from torchtitan.config import override\n"
        "from torchtitan.models.common.attention import GQAttention\n"
        "@override(target=GQAttention.Config, fqns=['model_spec.model.layers.*.attention'])\n"
        "def same_attention(cfg):\n"
        "    return cfg\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    (p,) = _problems("kernels=nki_rope", "kernels.overrides=[{target: attention_kernels.same_attention}]")
    assert p.key == "kernels.overrides.0" and "kernels.rope" in p.message and "(under " in p.message


def test_nki_moe_on_a_dense_model_is_an_error():
    (p,) = _problems("kernels=nki_moe")
    assert p.key == "kernels.moe.impl" and "dense" in p.message
    # also when the schema cannot know (flavor=auto): the tree has no GroupedExperts node
    acts = [overrides.Activation("kernels.moe", NKI_MOE, None, {"block_size": 128})]
    with pytest.raises(ConfigError) as e:
        overrides.claims(acts, _trainer_config("model.flavor=tiny"))
    assert e.value.problems[0].key == "kernels.moe.impl" and "dense" in e.value.problems[0].message


def test_nki_kernels_refuse_sharded_tensors():
    (p,) = _problems("kernels=nki_moe", "model.flavor=tiny_moe", "parallelism.ep=2")
    assert p.key == "parallelism.ep"


def test_user_override_mistakes_name_the_key(examples_on_path):
    (p,) = _problems("kernels.overrides=[{target: no_such_module.fn}]")
    assert p.key == "kernels.overrides.0.target" and "does not import" in p.message
    (p,) = _problems("kernels.overrides=[{target: my_kernels.silu_mul}]")
    assert p.key == "kernels.overrides.0.target" and p.allowed and "my_kernels.silu_mul_ffn" in p.allowed
    (p,) = _problems("kernels.overrides=[{target: my_kernels.silu_mul_ffn, kwargs: {upcst: true}}]")
    assert p.key == "kernels.overrides.0.kwargs" and p.allowed == "upcast"


@pytest.mark.slow  # quick tier: imports torchtitan to check the overrides
def test_cli_refuses_before_starting(tmp_path):
    r = run_cli("kernels=nki_moe", f"hydra.run.dir={tmp_path / 'run'}", timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "kernels.moe.impl = 'nki'" in r.stderr and "dense" in r.stderr
    assert not (tmp_path / "run").exists()


def test_user_override_from_the_readme(examples_on_path, tmp_path):
    """The README's worked example: own kernel on one layer, with kwargs, next to nki_rope."""
    import torch
    from torchtitan.config.override import apply_overrides

    from qwen3exp.titan.job_config import to_torchtitan

    prep = _prepare(
        "kernels=nki_rope",
        "kernels.overrides=[{target: my_kernels.silu_mul_ffn, "
        "fqns: [model_spec.model.layers.1.feed_forward], kwargs: {upcast: true}}]",
    )
    assert [(c["key"], len(c["nodes"])) for c in prep.overrides] == [("kernels.rope", 2), ("kernels.overrides.0", 1)]
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    stock = to_torchtitan(prep.exp, prep.facts, tmp_path)
    assert len(apply_overrides(config.override, config)) == 3
    torch.manual_seed(0)
    model = config.model_spec.model.build()
    ref = stock.model_spec.model.build()
    ref.load_state_dict(model.state_dict())
    assert type(model.layers["1"].feed_forward).__name__ == "SiluMulFeedForward"
    assert model.layers["1"].feed_forward.upcast
    tokens = torch.randint(0, 2048, (2, 64))
    assert torch.equal(model(tokens), ref(tokens))


def test_overridden_moe_model_equals_stock(tmp_path):
    """Both built-in overrides applied by torchtitan; the model's logits and gradients are the stock
    model's (the operators are really called: counted)."""
    import torch
    from torchtitan.config.override import apply_overrides

    from qwen3exp.kernels import moe_blockwise, rope
    from qwen3exp.titan.job_config import to_torchtitan

    prep = _prepare("kernels=nki_moe", "model.flavor=tiny_moe", "kernels.rope.impl=nki", "kernels.moe.block_size=16")
    config = to_torchtitan(prep.exp, prep.facts, tmp_path)
    stock = to_torchtitan(prep.exp, prep.facts, tmp_path)
    assert len(apply_overrides(config.override, config)) == 4
    torch.manual_seed(0)
    model = config.model_spec.model.build()
    model.init_states()
    ref = stock.model_spec.model.build()
    ref.load_state_dict(model.state_dict())
    calls = []
    orig_rope, orig_moe = rope.rope_pytorch, moe_blockwise.moe_forward_pytorch
    rope.rope_pytorch = lambda *a: calls.append("rope") or orig_rope(*a)
    moe_blockwise.moe_forward_pytorch = lambda *a: calls.append("moe") or orig_moe(*a)
    try:
        tokens = torch.randint(0, 2048, (2, 64))
        out = model(tokens)
    finally:
        rope.rope_pytorch, moe_blockwise.moe_forward_pytorch = orig_rope, orig_moe
    assert sorted(calls) == ["moe"] * 2 + ["rope"] * 2
    want = ref(tokens)
    assert torch.equal(out, want)
    out.square().mean().backward()
    want.square().mean().backward()
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        assert torch.equal(p.grad, q.grad), name


# ------------------------------------------------------------------------- model reductions
def _trainer_config(*ovr: str):
    from qwen3exp.titan.job_config import to_torchtitan

    prep = _prepare(*ovr)
    return to_torchtitan(prep.exp, prep.facts, Path("/nonexistent"))


def test_walkthrough_reductions_reach_the_model_and_nki_moe_claims_every_layer():
    """30B-A3B cut to 4 layers, 64 experts, top-4 (the walkthrough's MoE run), as one line."""
    ovr = (
        "model.flavor=30B-A3B",
        "model.n_layers=4",
        "model.num_experts=64",
        "model.top_k=4",
        "kernels=nki_moe",
        "training.seq_len=256",
        "platform=cpu",
    )
    model = _trainer_config(*ovr).model_spec.model
    assert len(model.layers) == 4
    for layer in model.layers:
        moe = layer.moe
        assert moe.num_experts == 64 and moe.router.num_experts == 64 and moe.router.top_k == 4
        assert moe.routed_experts.inner_experts.num_experts == 64
        assert moe.routed_experts.token_dispatcher.num_experts == 64 and moe.routed_experts.token_dispatcher.top_k == 4
    (claim,) = _prepare(*ovr).overrides
    assert len(claim["nodes"]) == 4


def test_reduced_tiny_moe_builds_with_the_reduced_parameter_count():
    import torch

    from qwen3exp.config.schema import validate_experiment

    exp = validate_experiment(compose("experiment=tiny_moe_nki"))
    arch = exp.model.arch()
    assert (arch.n_layers, arch.moe.num_experts, arch.moe.top_k) == (2, 4, 2)
    with torch.device("meta"):
        model = _trainer_config("experiment=tiny_moe_nki").model_spec.model.build()
    assert sum(p.numel() for p in model.parameters()) == arch.param_counts()[0]
    assert model.layers["0"].moe.router.top_k == 2 and len(model.layers) == 2
