"""LoRA (issue 23) on one process: the adapters (deterministic, lora_B = 0, only they train), the reference as the
actor with its adapters disabled, the merge against peft's own ``merge_and_unload``, the config's checks (at load
and against the model's config.json), and import-verl's translation of verl's LoRA keys."""

from __future__ import annotations

import functools

import pytest
import torch

from hpcppo.verl.importer import read_command_line, translate
from hpcppo.errors import ConfigError, PathError

CMD = "python3 -m verl.trainer.main_ppo "


def _tiny(directory) -> str:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                 intermediate_size=48, vocab_size=50, max_position_embeddings=2048)).save_pretrained(
        directory)
    return str(directory)


def _actor(path: str, *, empty: bool = False, **lora):
    from hpcppo import models
    from hpcppo.config.lora import LoraSection
    from hpcppo.distributed.loading import materialize, match_checkpoint, load_shards
    from hpcppo.train.lora import with_lora

    model = with_lora(functools.partial(models.build_actor, path), LoraSection(**lora))(empty=empty)
    if empty:  # as load_sharded fills it on one rank: the base from the files, the adapters as built
        keys, missing = match_checkpoint(model, path)
        assert not missing
        materialize(model, torch.device("cpu"))
        load_shards(model, path, keys)
    return model


def test_adapters_are_deterministic_zero_at_start_and_the_only_trainable_weights(tmp_path):
    path = _tiny(tmp_path)
    torch.manual_seed(1)
    whole = _actor(path, rank=4, alpha=8)
    torch.manual_seed(2)  # the global generator does not matter: every rank draws the same adapters
    empty = _actor(path, empty=True, rank=4, alpha=8)
    a, b = dict(whole.named_parameters()), dict(empty.named_parameters())
    assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    trainable = sorted(n for n, p in a.items() if p.requires_grad)
    assert trainable and all(".lora_A.default." in n or ".lora_B.default." in n for n in trainable)
    assert len(trainable) == 2 * 7 * 2 and not any("lm_head" in n or "embed" in n for n in a if ".lora_" in n)
    assert all(not p.any() for n, p in a.items() if ".lora_B." in n) and all(p.any() for n, p in a.items()
                                                                             if ".lora_A." in n)
    from hpcppo.models import build_actor

    base = build_actor(path).eval()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():  # lora_B = 0: step 0 is the base model
        torch.testing.assert_close(whole.eval()(input_ids=ids).logits, base(input_ids=ids).logits)


def test_the_runs_seed_decides_the_adapters_and_actor_and_critic_draw_apart(tmp_path):
    """``seed`` is the run's one seed for initialisation: another seed draws other lora_A values, the same seed
    the same ones, and the actor's and the critic's streams differ (train.lora.adapter_seed)."""
    from hpcppo import models
    from hpcppo.config.lora import LoraSection
    from hpcppo.train.lora import adapter_seed, with_lora

    path = _tiny(tmp_path)

    def lora_a(seed: int) -> torch.Tensor:
        model = with_lora(functools.partial(models.build_actor, path), LoraSection(rank=4, alpha=8), seed=seed)()
        return torch.cat([p.flatten() for n, p in model.named_parameters() if ".lora_A." in n])

    one, again = lora_a(adapter_seed(1, "actor")), lora_a(adapter_seed(1, "actor"))
    other = lora_a(adapter_seed(2, "actor"))
    assert torch.equal(one, again) and not torch.equal(one, other)
    assert adapter_seed(1, "actor") != adapter_seed(1, "critic")


def test_reference_is_the_actor_without_its_adapters_and_they_come_back_trainable(tmp_path):
    from hpcppo.models import build_actor
    from hpcppo.models.lora import adapters_disabled

    path = _tiny(tmp_path)
    actor = _actor(path, rank=4, alpha=8).eval()
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if ".lora_B." in name:
                p.normal_(generator=torch.Generator().manual_seed(len(name)))
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        adapted = actor(input_ids=ids).logits
        with adapters_disabled(actor) as reference:
            disabled = reference(input_ids=ids).logits
        again = actor(input_ids=ids).logits
        base = build_actor(path).eval()(input_ids=ids).logits
    assert torch.equal(disabled, base) and not torch.allclose(adapted, base) and torch.equal(again, adapted)
    assert all(p.requires_grad == (".lora_" in n) for n, p in actor.named_parameters())


def test_the_sync_gathers_only_the_merged_tensors_in_the_master_dtype(tmp_path, monkeypatch):
    """actor_weights asks iter_full_params (here a recording stand-in, not a gather) for the master dtype on an
    adapted layer's base weight, lora_A and lora_B only: embeddings, norms and the head travel in the engine's
    dtype as without LoRA; what comes out is all in the engine's dtype."""
    import hpcppo.train.lora as train_lora

    actor = _actor(_tiny(tmp_path), rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    asked: dict[str, torch.dtype | None] = {}

    def recording_iter_full_params(model, *, dtype=None, into=None):
        for name, param in model.named_parameters():
            asked[name] = dtype(name) if callable(dtype) else dtype
            yield name, param.detach() if asked[name] is None else param.detach().to(asked[name])

    monkeypatch.setattr(train_lora, "iter_full_params", recording_iter_full_params)
    out = dict(train_lora.actor_weights(actor, dtype=torch.bfloat16, into=None))
    master = sorted(n for n, d in asked.items() if d is None)
    assert master and all(".base_layer.weight" in n or ".lora_" in n for n in master)
    assert len(master) == 3 * 2 * 2  # base weight, A, B of q_proj and v_proj in each of the 2 layers
    assert asked["model.embed_tokens.weight"] == asked["model.norm.weight"] == torch.bfloat16
    assert all(t.dtype == torch.bfloat16 for t in out.values()) and not any(".lora_" in n for n in out)


def test_merge_stream_equals_peft_merge_and_unload_bit_for_bit(tmp_path):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    from hpcppo.models.lora import merge_stream, scalings

    path = _tiny(tmp_path)
    actor = _actor(path, rank=4, alpha=12, target_modules=["q_proj", "v_proj", "down_proj"],
                   exclude_modules=["k_proj"])
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if ".lora_B." in name:
                p.normal_(generator=torch.Generator().manual_seed(len(name)))
    trained = {n: p.detach().clone() for n, p in actor.named_parameters()}
    merged = dict(merge_stream(reversed(list(actor.named_parameters())), scalings(actor), dtype=torch.bfloat16))
    peft_model = get_peft_model(LlamaForCausalLM.from_pretrained(path), LoraConfig(
        r=4, lora_alpha=12, target_modules=["q_proj", "v_proj", "down_proj"], bias="none"))
    result = peft_model.load_state_dict({"base_model.model." + n: t for n, t in trained.items()}, strict=False)
    assert not result.unexpected_keys
    expected = dict(peft_model.merge_and_unload().named_parameters())
    assert merged.keys() == expected.keys()
    for name, tensor in expected.items():
        assert merged[name].dtype == torch.bfloat16 and torch.equal(merged[name], tensor.detach().bfloat16()), name
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(merged[q], trained[q.replace(".weight", ".base_layer.weight")].bfloat16())
    with pytest.raises(KeyError, match="lora_A and lora_B"):
        list(merge_stream([(n, t) for n, t in trained.items() if ".lora_B." not in n], scalings(actor)))


def _spec(tmp_path, lora: str) -> object:
    from hpcppo.config import load_experiment

    (tmp_path / "train.parquet").write_bytes(b"")
    spec = tmp_path / "exp.toml"
    spec.write_text(f'name = "l"\n[model]\npath = "m"\n[data]\ntrain_files = ["train.parquet"]\n{lora}')
    return load_experiment(spec)


@pytest.mark.parametrize("lora,message", [
    ("[actor.lora]\nalpha = 32\n", "actor.lora.alpha: sets up a LoRA adapter and does nothing with rank = 0"),
    ("[critic.lora]\nrank = 4\ntarget_modules = [\"all-linear\", \"q_proj\"]\n",
     "critic.lora.target_modules: ['all-linear', 'q_proj']: \"all-linear\" stands alone"),
    ("[actor.lora]\nrank = 4\ntarget_modules = [\"q_proj\"]\nexclude_modules = [\"q_proj\"]\n",
     "actor.lora.exclude_modules: ['q_proj'] are also in target_modules"),
    ("[actor.lora]\nrank = -1\n", "actor.lora.rank"),
    ("[critic.lora]\nrank = 4\nadapter_path = \"a\"\n", "critic.lora: adapter_path is the actor's only"),
])
def test_bad_lora_settings_are_one_line_errors_naming_the_key(tmp_path, lora, message):
    with pytest.raises(ConfigError) as err:
        _spec(tmp_path, lora)
    assert message in str(err.value) and "exp.toml" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("lora,message", [
    ("[actor.lora]\nrank = 8\ntarget_modules = [\"c_attn\"]\n",
     "actor.lora.target_modules: 'c_attn' is not a linear layer of"),
    ("[critic.lora]\nrank = 8\nexclude_modules = [\"lm_head\"]\n", "critic.lora.exclude_modules: 'lm_head'"),
    ("[actor.lora]\nrank = 8\ntarget_modules = [\"q_proj\"]\nexclude_modules = [\"v_proj\", \"k_proj\"]\n", None),
])
def test_compile_checks_target_modules_against_the_models_config(tmp_path, lora, message):
    from hpcppo.config import check_experiment_paths

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "qwen2", "max_position_embeddings": 4096}')
    exp = _spec(tmp_path, lora)
    if message is None:
        check_experiment_paths(exp)
        return
    with pytest.raises(ConfigError) as err:
        check_experiment_paths(exp)
    text = str(err.value)
    assert message in text and "allowed: \"all-linear\" or any of q_proj, k_proj, v_proj, o_proj, gate_proj" in text


@pytest.mark.parametrize("model_type,targets", [("qwen3_moe", "q_proj, k_proj, v_proj, o_proj"),
                                                  ("qwen2_moe", "o_proj, gate_proj, up_proj, down_proj")])
def test_compile_refuses_all_linear_on_a_mixture_of_experts_and_takes_its_plain_linears(tmp_path, model_type, targets):
    """The fused experts are no nn.Linear: "all-linear" would reach them and the job would fail at start, after
    the queue (models.lora refuses them); compile says so and names the layers that work."""
    from hpcppo.config import check_experiment_paths

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(f'{{"model_type": "{model_type}", "max_position_embeddings": 4096}}')
    with pytest.raises(ConfigError) as err:
        check_experiment_paths(_spec(tmp_path, "[actor.lora]\nrank = 8\n"))
    text = str(err.value)
    listed = ", ".join(f'"{t}"' for t in targets.split(", "))
    assert "actor.lora.target_modules" in text and "fused experts" in text and listed in text and "\n" not in text
    check_experiment_paths(_spec(tmp_path, f"[actor.lora]\nrank = 8\ntarget_modules = [{listed}]\n"))


def _imported(*tokens: str, tmp_path):
    settings, _ = read_command_line(CMD + " ".join(tokens))
    imp = translate(settings, cwd=tmp_path)
    return imp.values, {text.split("=")[0]: (kind, why) for kind, text, why in imp.report}


def test_import_verl_translates_the_lora_keys_of_actor_and_critic(tmp_path):
    m = "actor_rollout_ref.model."
    values, why = _imported(m + "lora_rank=32", m + "lora_alpha=64", m + "target_modules=[q_proj,v_proj]",
                            m + "exclude_modules=[v_proj]", "critic.model.lora_rank=8",
                            "critic.model.target_modules=all-linear", "critic.model.exclude_modules=[o_proj]",
                            tmp_path=tmp_path)
    assert values["actor.lora.rank"] == 32 and values["actor.lora.alpha"] == 64
    assert values["actor.lora.target_modules"] == ["q_proj", "v_proj"]
    assert values["actor.lora.exclude_modules"] == ["v_proj"]
    assert values["critic.lora.rank"] == 8 and values["critic.lora.target_modules"] == ["all-linear"]
    assert "critic.lora.exclude_modules" not in values  # verl's critic builds its LoraConfig without them
    assert why["critic.model.exclude_modules"][0] == "ignored"
    # Settings of an adapter that verl does not build (lora_rank = 0) are not translated, a regex is refused, a
    # trained adapter to load is unsupported.
    # verl builds no reference worker with LoRA (ref_in_actor): its offload does nothing there, nor here.
    values, why = _imported(m + "lora_rank=8", "actor_rollout_ref.ref.fsdp_config.param_offload=True",
                            tmp_path=tmp_path)
    assert "reference.offload" not in values
    assert why["actor_rollout_ref.ref.fsdp_config.param_offload"][0] == "ignored"
    values, _ = _imported("actor_rollout_ref.ref.fsdp_config.param_offload=True", tmp_path=tmp_path)
    assert values["reference.offload"] is True
    values, why = _imported(m + "lora_alpha=64", m + "target_modules=all-linear", tmp_path=tmp_path)
    assert not any(k.startswith("actor.lora.") for k in values)
    assert why[m + "lora_alpha"] == ("ignored", "only with lora_rank > 0 (verl builds no adapter otherwise)")
    values, why = _imported(m + "lora_rank=8", m + "target_modules='.*proj'", m + "lora_adapter_path=/a/b",
                            "critic.model.lora_adapter_path=/c", tmp_path=tmp_path)
    assert values["actor.lora.rank"] == 8 and "actor.lora.target_modules" not in values
    assert why[m + "target_modules"][0] == "unsupported" and "regular expression" in why[m + "target_modules"][1]
    assert values["actor.lora.adapter_path"] == "/a/b"
    assert why["critic.model.lora_adapter_path"][0] == "unsupported"  # a peft adapter holds no value head


def test_a_trained_adapter_is_continued_and_checked_at_compile(tmp_path):
    """An adapter in peft's format (hpcppo export's lora_adapter/, verl's lora_adapter_path): the actor starts from
    its weights; compile refuses one whose r, alpha or targets are not the section's, or that is not plain LoRA."""
    import json

    from hpcppo.config import check_experiment_paths
    from hpcppo.models.lora import save_adapter

    path = _tiny(tmp_path / "m")
    trained = _actor(path, rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    with torch.no_grad():
        for name, p in trained.named_parameters():
            if ".lora_" in name:
                p.normal_(generator=torch.Generator().manual_seed(len(name)))
    save_adapter(trained, tmp_path / "adapter", path)
    lora = dict(rank=4, alpha=8, target_modules=["q_proj", "v_proj"])
    for empty in (False, True):  # whole, and as the trainer builds it (meta device, then the files)
        resumed = _actor(path, empty=empty, adapter_path=str(tmp_path / "adapter"), **lora)
        a, b = dict(trained.named_parameters()), dict(resumed.named_parameters())
        assert a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)
    with pytest.raises(ValueError, match="lora_A.weight of shape"):
        _actor(path, adapter_path=str(tmp_path / "adapter"), rank=4, alpha=8, target_modules=["q_proj", "k_proj"])

    section = '[actor.lora]\nrank = {r}\nalpha = 8\ntarget_modules = ["q_proj", "v_proj"]\nadapter_path = "adapter"\n'
    check_experiment_paths(_spec(tmp_path, section.format(r=4)))
    with pytest.raises(ConfigError, match=r"actor.lora.adapter_path: .*the adapter has r = 4, lora_alpha = 8.*"
                                          r"this section has rank = 8"):
        check_experiment_paths(_spec(tmp_path, section.format(r=8)))
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    (tmp_path / "adapter" / "adapter_config.json").write_text(json.dumps(config | {"use_dora": True}))
    with pytest.raises(ConfigError, match="the adapter's use_dora is True; hpcppo continues plain LoRA adapters only"):
        check_experiment_paths(_spec(tmp_path, section.format(r=4)))
    (tmp_path / "adapter" / "adapter_model.safetensors").unlink()
    with pytest.raises(PathError, match="actor.lora.adapter_path: .* has no adapter_model.safetensors"):
        check_experiment_paths(_spec(tmp_path, section.format(r=4)))
    # peft saves "all-linear" expanded to module paths: every layer of each name, which "all-linear" matches.
    save_adapter(_actor(path, rank=4, alpha=8), tmp_path / "all", path)
    assert "model.layers.1.mlp.up_proj" in json.loads((tmp_path / "all" / "adapter_config.json").read_text())[
        "target_modules"]
    check_experiment_paths(_spec(tmp_path, '[actor.lora]\nrank = 4\nalpha = 8\nadapter_path = "all"\n'))


def test_a_critic_lora_without_a_critic_and_an_offloaded_reference_that_is_the_actor_are_refused(tmp_path):
    from hpcppo.config import load_site, resolve
    from hpcppo.errors import ResolveError

    exp = _spec(tmp_path, "[algorithm]\nadv_estimator = \"grpo\"\n[rollout]\nn = 2\n[critic.lora]\nrank = 4\n")
    with pytest.raises(ResolveError, match="critic.lora.rank=4 but algorithm.adv_estimator='grpo' trains no critic"):
        resolve(load_site("local"), exp)
    exp = _spec(tmp_path, "[actor.lora]\nrank = 4\n[algorithm]\nuse_kl_in_reward = true\n[reference]\noffload = true\n")
    with pytest.raises(ResolveError, match="reference.offload=true but actor.lora.rank=4: .* no copy to offload"):
        resolve(load_site("local"), exp)


def test_plan_counts_gradients_and_moments_of_the_adapters_only_and_no_reference_copy(tmp_path):
    from peft import LoraConfig, inject_adapter_in_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from hpcppo.compiler import compile_config
    from hpcppo.config.lora import LoraSection
    from hpcppo.sizing.accumulation import grads_in_flight
    from hpcppo.sizing.catalog import KNOWN_MODELS
    from hpcppo.sizing.estimate import estimate
    from hpcppo.sizing.lora import adapter_params

    # The adapter count is peft's own on a model of the same shape (scaled down: Qwen2.5-7B's proportions).
    shape = KNOWN_MODELS["qwen2.5-7b"]
    small = Qwen2Config(hidden_size=shape.hidden // 32, num_hidden_layers=2, num_attention_heads=shape.heads // 2,
                        num_key_value_heads=shape.kv_heads, intermediate_size=shape.intermediate // 32,
                        vocab_size=64, head_dim=shape.hidden // shape.heads // 8)
    lora = LoraSection(rank=8, target_modules=["q_proj", "k_proj", "down_proj"])
    model = inject_adapter_in_model(LoraConfig(r=8, target_modules=["q_proj", "k_proj", "down_proj"]),
                                    Qwen2ForCausalLM(small))
    counted = sum(p.numel() for n, p in model.named_parameters() if ".lora_" in n)
    from hpcppo.sizing.estimate import _from_config_json

    small.save_pretrained(tmp_path / "small")
    assert adapter_params(_from_config_json(tmp_path / "small" / "config.json"), lora) == counted > 0

    (tmp_path / "exp.toml").write_text('name = "q7b"\n[model]\npath = "Qwen/Qwen2.5-7B-Instruct"\n[data]\n'
                                       'train_files = ["t.parquet"]\n[rollout]\nengine = "vllm"\nn = 4\n'
                                       '[actor]\nppo_mini_batch_size = 64\nuse_kl_loss = true\n'
                                       '[algorithm]\nadv_estimator = "grpo"\n[trainer]\ntrain_batch_size = 64\n')

    def update_items(overrides):
        c = compile_config(tmp_path / "exp.toml", "a100-cluster", overrides, check_paths=False, check_memory=False)
        budget = estimate(c.site, c.experiment, c.plan)
        [update] = [p for p in budget.phases if p.name == "actor update"]
        return {i.what: i.bytes for i in update.items}, budget, c

    full, full_budget, _ = update_items([])
    lora_items, lora_budget, c = update_items(["actor.lora.rank=32"])
    shard = lora_budget.shard_size
    adapters = adapter_params(shape, c.experiment.actor.lora)
    assert adapters == 28 * 32 * (2 * (3584 + 3584) + 2 * (3584 + 512) + 3 * (3584 + 18944))  # all-linear
    # the fp32 gradient shard of the adapters + one (whole) layer's unsharded gradients in flight, as in a full update
    in_flight = grads_in_flight(shape, shape.layer_params, 2, 4)
    [lora_grads] = [v for k, v in lora_items.items() if k.startswith("actor grads: fp32 shard")]
    [full_grads] = [v for k, v in full.items() if k.startswith("actor grads: fp32 shard")]
    assert lora_grads == -(-adapters * 4 // shard) + in_flight
    assert lora_items["actor AdamW moments (fp32 shard)"] == -(-adapters * 8 // shard)
    assert lora_items["actor params (fp32 shard)"] == -(-(shape.params + adapters) * 4 // shard)
    assert full_grads == -(-shape.params * 4 // shard) + in_flight
    rollout = {i.what for p in lora_budget.phases for i in p.items}
    assert "reference params (fp32 shard)" not in rollout  # the actor without its adapters is the reference
    assert "reference params (fp32 shard)" in {i.what for p in full_budget.phases for i in p.items}
    assert lora_budget.peak.total < full_budget.peak.total
    assert lora_budget.model_note.endswith("; LoRA on the actor: rank 32, 80.7M adapter parameters trained, the base "
                                           "frozen; the reference is the actor without its adapters (no copy)")
    assert "LoRA" not in full_budget.model_note


def test_the_lora_example_compiles(tmp_path):
    from pathlib import Path

    from hpcppo.compiler import compile_config

    example = Path(__file__).resolve().parents[2] / "examples" / "arith-tiny-lora.toml"
    c = compile_config(example, "local", check_paths=False)
    assert c.experiment.actor.lora.rank == c.experiment.critic.lora.rank == 16 and c.plan.needs_critic
    assert c.plan.needs_reference  # served by the actor with its adapters disabled


def test_adapters_get_gradients_through_activation_checkpointing(tmp_path):
    from hpcppo.distributed.fsdp import apply_activation_checkpointing

    actor = _actor(_tiny(tmp_path), rank=4, alpha=8)
    apply_activation_checkpointing(actor)  # as load_sharded applies it with model.gradient_checkpointing
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(3))
    actor.train()(input_ids=ids).logits.logsumexp(-1).mean().backward()
    grads = {n: p.grad for n, p in actor.named_parameters()}
    assert all(g is not None and g.any() for n, g in grads.items() if ".lora_B." in n)
    assert all(g is None for n, g in grads.items() if ".lora_" not in n)
