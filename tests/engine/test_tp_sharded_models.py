"""Tensor-parallel plans against the installed transformers: every style it registers or its models use is
known, and every rank of a sharded tiny model (ranks as threads) computes the whole model's logits.

Per style, on toy modules: tests/engine/test_tp_plan_styles.py; end to end: tests/engine/test_tensor_parallel.py.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import transformers
from thread_ranks import shard_on_ranks as sharded

from pagedinfer.engine.distributed import plan_styles
from pagedinfer.engine.distributed.sharding import kv_heads_per_rank
from pagedinfer.engine.tiny_model import tiny_config

CLOSE = dict(rtol=1e-5, atol=1e-5)


# ----- the vocabulary: every style the installed transformers knows is classified ----------------------------


def _registered_styles() -> set[str]:
    from transformers.integrations import tensor_parallel

    try:  # 5.x registers the expert-parallel styles in their own module
        import transformers.distributed.expert_parallel  # noqa: F401
    except ImportError:
        pass
    registry = tensor_parallel.ALL_PARALLEL_STYLES
    return set(getattr(registry, "_global_mapping", None) or registry)


def _styles_in_model_sources() -> set[str]:
    """The style names of every model's `base_model_tp_plan` and `_tp_plan`, read from the sources (fast)."""
    root = Path(transformers.__file__).parent / "models"
    styles = set()
    for path in list(root.glob("*/configuration_*.py")) + list(root.glob("*/modeling_*.py")):
        for block in re.findall(r"(?:base_model_tp_plan|_tp_plan)\s*=\s*\{(.*?)\}", path.read_text(), re.S):
            styles |= set(re.findall(r'"[^"]+"\s*:\s*"([a-z_]+)"', block))
    return styles


def test_every_style_the_installed_transformers_registers_is_implemented_or_refused():
    known = set(plan_styles.STYLES) | set(plan_styles.REFUSED)
    registered = _registered_styles()
    assert "colwise" in registered and "rowwise" in registered
    assert registered <= known, f"transformers {transformers.__version__}: {sorted(registered - known)}"


def test_every_style_the_installed_models_plans_use_is_implemented():
    used = _styles_in_model_sources()
    assert {"colwise", "rowwise"} <= used
    assert used <= set(plan_styles.STYLES) | set(plan_styles.REFUSED), sorted(used - set(plan_styles.STYLES))


# ----- real transformers models: every rank's logits equal the whole model's -----------------------------------

PLAN_456 = {  # what transformers 4.56 declares for Phi-3 and for every causal-LM head
    "phi3": (
        {
            "layers.*.self_attn.qkv_proj": "colwise_rep",
            "layers.*.self_attn.o_proj": "rowwise_rep",
            "layers.*.mlp.gate_up_proj": "colwise_rep",
            "layers.*.mlp.down_proj": "rowwise_rep",
        },
        {"lm_head": "colwise_rep"},
    ),
    "llama-gathered-attention": (
        {  # olmo2 / flex_olmo's style of plan, on a llama
            "layers.*.self_attn.q_proj": "colwise_gather_output",
            "layers.*.self_attn.k_proj": "colwise_gather_output",
            "layers.*.self_attn.v_proj": "colwise_gather_output",
            "layers.*.self_attn.o_proj": "rowwise_split_input",
            "layers.*.mlp.gate_proj": "colwise",
            "layers.*.mlp.up_proj": "colwise",
            "layers.*.mlp.down_proj": "rowwise",
        },
        {"lm_head": "colwise_gather_output"},
    ),
}


@pytest.mark.parametrize(
    "arch, plan, n",
    [
        ("llama", "installed", 2),
        ("qwen3", "installed", 2),
        ("phi3", "installed", 2),
        ("phi3", "installed", 4),
        ("phi3", "4.56", 2),
        ("llama", "llama-gathered-attention", 2),
    ],
)
def test_every_rank_of_a_sharded_model_computes_the_whole_models_logits(monkeypatch, arch, plan, n):
    torch.manual_seed(0)
    config = tiny_config(arch, tie_word_embeddings=False)
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    if plan != "installed":
        base, head = PLAN_456[arch if plan == "4.56" else plan]
        monkeypatch.setattr(model.config, "base_model_tp_plan", base, raising=False)
        monkeypatch.setattr(type(model), "_tp_plan", head)
    ids = torch.randint(8, config.vocab_size, (2, 9))
    with torch.no_grad():
        want = model(ids).logits
    ranks, copies = sharded(model, n)
    kv = config.num_key_value_heads
    expect_kv = kv // n if arch != "phi3" and plan != "llama-gathered-attention" else kv
    assert kv_heads_per_rank(copies[0], kv, n) == expect_kv
    with torch.no_grad():
        outs = ranks.run(lambda group: copies[group.rank](ids).logits)
    for out in outs:
        torch.testing.assert_close(out, want, **CLOSE)
