"""What the vLLM engine asks of vLLM, checked against ``tests/_fakes/recording_vllm`` — a recording stand-in, NOT
vLLM: these tests show the calls, their order and their arguments, never that vLLM honours them (the GPU tests do).

The sequence per step follows verl's colocated rollout: empty_cache -> wake_up(weights) -> weights streamed in
the training dtype in bounded buckets -> reset_prefix_cache -> wake_up(kv_cache) -> generate -> sleep(level 2)
-> empty_cache; the engine starts from ``load_format="dummy"``, and RANK/LOCAL_RANK/... are exported from the
detected environment before ``vllm.LLM`` is built (vLLM's external launcher reads them).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "_fakes"))
import recording_vllm  # noqa: E402

from hpcppo.distributed.env import detect_env  # noqa: E402
from hpcppo.distributed.weights import iter_full_params  # noqa: E402
from hpcppo.rollout import SamplingParams  # noqa: E402
from hpcppo.rollout import vllm_engine  # noqa: E402
from hpcppo.rollout.base import batch_from_lists, generation_config_eos, stop_token_ids  # noqa: E402
from hpcppo.rollout.vllm_engine import VLLMRolloutEngine, weight_buckets  # noqa: E402

LAUNCHER = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture
def fake_vllm(monkeypatch):
    """The recording stand-in installed as ``vllm``; empty_cache recorded into the same call log."""
    for name, module in recording_vllm.modules().items():
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(vllm_engine, "_empty_cache", lambda: recording_vllm.CALLS.append(("empty_cache",)))
    for key in LAUNCHER:  # set, then removed: recorded either way, so what the engine exports is undone afterwards
        monkeypatch.setenv(key, "")
        monkeypatch.delenv(key)
    monkeypatch.delenv("VLLM_ENABLE_V1_MULTIPROCESSING", raising=False)
    recording_vllm.reset()
    yield recording_vllm
    recording_vllm.reset()


def _actor() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(32, 16), torch.nn.Linear(16, 16), torch.nn.Linear(16, 32))


SAMPLING = SamplingParams(eos_token_id=(2, 3), pad_token_id=0, n=2, temperature=1.0, max_new_tokens=6, seed=11)


def test_launcher_variables_are_exported_from_slurm_before_the_engine_is_built(fake_vllm):
    # srun sets SLURM_* only; vLLM's ExecutorWithExternalLauncher reads os.environ["RANK"] and ["LOCAL_RANK"].
    slurm = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NODEID": "1",
             "SLURM_NNODES": "2", "SLURM_TASKS_PER_NODE": "4(x2)", "SLURM_JOB_NODELIST": "gpu[007-008]",
             "SLURM_JOB_ID": "4242"}
    env = detect_env(slurm, device_type="cpu")
    VLLMRolloutEngine("/models/m", dist_env=env)
    (name, kwargs, seen), *after = fake_vllm.CALLS
    assert name == "LLM"
    assert after == [("sleep", 2), ("empty_cache",)]  # its dummy weights are worthless: asleep from the start
    assert seen == {"RANK": "5", "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4",
                    "MASTER_ADDR": "gpu007", "MASTER_PORT": str(env.master_port)}
    assert "dist_env" not in kwargs
    assert kwargs["distributed_executor_backend"] == "external_launcher"


def test_contradicting_launcher_variables_are_refused(fake_vllm, monkeypatch):
    env = detect_env({"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, device_type="cpu")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(Exception, match="RANK=0 but this process is RANK=1"):
        VLLMRolloutEngine("/models/m", dist_env=env)


def test_engine_arguments_dummy_load_and_sleep_mode(fake_vllm):
    VLLMRolloutEngine("/models/m", tensor_parallel_size=2)
    kwargs = fake_vllm.CALLS[0][1]
    assert kwargs["load_format"] == "dummy"  # no rank reads the checkpoint the first sync overwrites
    assert kwargs["enable_sleep_mode"] is True
    assert kwargs["tensor_parallel_size"] == 2
    assert kwargs["logprobs_mode"] == "processed_logprobs"


def test_a_dummy_loaded_engine_sleeps_at_level_2_right_after_construction(fake_vllm):
    # Awake, its dummy weights and KV cache would sit under the model build and DCP's optimizer-state load.
    VLLMRolloutEngine("/models/m", sleep_level=1)
    assert fake_vllm.CALLS[1:] == [("sleep", 2), ("empty_cache",)]  # level 2 whatever the step's level: no copy
    fake_vllm.reset()
    VLLMRolloutEngine("/models/m", load_format="auto")  # real weights: kept awake for the first generate
    VLLMRolloutEngine("/models/m", enable_sleep_mode=False)  # vLLM would refuse sleep() without sleep mode
    assert fake_vllm.names() == ["LLM", "LLM"]


def test_one_step_calls_in_verl_order(fake_vllm):
    engine = VLLMRolloutEngine("/models/m", sync_bucket_bytes=2**30)
    with pytest.raises(RuntimeError, match="has no weights"):  # dummy weights are never sampled from
        engine.generate([[5, 6]], SAMPLING)
    engine.sleep()  # already asleep since construction: nothing to do
    fake_vllm.reset()
    for step in range(2):
        engine.wake_up()
        assert engine.sync_targets is None  # vLLM fuses what it loads: nothing to gather into in place
        engine.sync_weights(iter_full_params(_actor(), dtype=engine.sync_dtype, into=engine.sync_targets))
        assert not engine.weights_dropped
        engine.generate([[5, 6], [7]], SAMPLING)
        engine.sleep()
        assert engine.weights_dropped  # level 2 discarded them: the next step must sync even if the actor is the same
    step = [c if c[0] not in ("load_weights", "generate", "finalize_layerwise_reload") else (c[0],)
            for c in fake_vllm.CALLS]
    # the weights arrive through vLLM's in-place layerwise reload (initialize -> load_weights -> finalize)
    one = [("empty_cache",), ("wake_up", ["weights"]), ("initialize_layerwise_reload",), ("load_weights",),
           ("finalize_layerwise_reload",), ("reset_prefix_cache",),
           ("empty_cache",), ("wake_up", ["kv_cache"]), ("generate",), ("sleep", 2), ("empty_cache",)]
    assert step == one + one


def test_weights_stream_in_the_engine_dtype_in_bounded_buckets(fake_vllm):
    engine = VLLMRolloutEngine("/models/m", dtype="bfloat16", sync_bucket_bytes=1200)
    actor = _actor()
    received = engine.sync_weights(iter_full_params(actor, dtype=engine.sync_dtype))
    loads = [c[1] for c in fake_vllm.CALLS if c[0] == "load_weights"]
    assert len(loads) > 1
    for bucket in loads:
        assert sum(nbytes for *_, nbytes in bucket) <= 1200 or len(bucket) == 1
        assert {dtype for _, dtype, *_ in bucket} == {torch.bfloat16}  # not the fp32 masters
    names = [n for bucket in loads for n, *_ in bucket]
    assert names == [n for n, _ in actor.named_parameters()]
    assert received == sum(p.numel() * 2 for p in actor.parameters())


def test_weight_buckets_bound_and_order():
    tensors = [(f"t{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([10, 10, 30, 5, 5, 1])]
    buckets = list(weight_buckets(iter(tensors), max_bytes=80))
    assert [[n for n, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4", "t5"]]
    with pytest.raises(ValueError):
        list(weight_buckets(iter(tensors), max_bytes=0))


def test_without_sleep_mode_the_prefix_cache_is_still_reset_after_every_sync(fake_vllm):
    # rollout.free_cache_engine = false: the engine never sleeps, so only the reset drops blocks from old weights.
    engine = VLLMRolloutEngine("/models/m", enable_sleep_mode=False, load_format="auto")
    fake_vllm.reset()
    for _ in range(2):
        engine.wake_up()
        engine.sync_weights(iter_full_params(_actor()))
        engine.generate([[5]], SAMPLING)
        engine.sleep()
    assert fake_vllm.names() == ["initialize_layerwise_reload", "load_weights", "finalize_layerwise_reload",
                                 "reset_prefix_cache", "generate"] * 2


def test_stop_ids_union_tokenizer_and_generation_config(tmp_path, fake_vllm):
    from transformers import GenerationConfig

    GenerationConfig(eos_token_id=[3, 9]).save_pretrained(tmp_path)
    assert generation_config_eos(tmp_path) == [3, 9]
    assert generation_config_eos(tmp_path / "missing") is None
    stops = stop_token_ids(2, generation_config_eos(tmp_path))
    assert stops == (2, 3, 9)
    # vLLM stops at a generation_config EOS (the stand-in ends early responses with the last stop id, 9)
    engine = VLLMRolloutEngine("/models/m", load_format="auto")
    sampling = SamplingParams(eos_token_id=stops, pad_token_id=0, n=4, max_new_tokens=12, seed=1)
    batch = engine.generate([[5, 6], [7, 8, 1]], sampling)
    assert fake_vllm.CALLS[-1][3] == [[2, 3, 9]] * 2  # every stop id reaches vLLM
    lengths = batch.response_lengths.tolist()
    ended = [batch.response_ids[i, lengths[i] - 1].item() for i in range(batch.num_samples)]
    assert any(t == 9 for t in ended)
    # the batch ends a response at *any* stop id, and masks what an engine wrote after it
    b = batch_from_lists([[1]], [[4, 9, 5, 6], [4, 5, 6, 7]], [[-1.0] * 4] * 2, n=2, eos_token_ids=stops,
                         pad_token_id=0)
    assert b.response_mask.tolist() == [[1, 1, 0, 0], [1, 1, 1, 1]]
    assert b.response_ids[0].tolist() == [4, 9, 0, 0]
