"""The vLLM engine's pure logic, with fake vLLM objects (vLLM itself is not installed here)."""
import dataclasses
import importlib
import re
import sys
import types
from types import SimpleNamespace as NS

import pytest
import torch

from rpg_ref.engines import vllm as ve


def test_module_imports_without_vllm():
    assert "vllm" not in sys.modules or sys.modules["vllm"] is not None
    importlib.reload(ve)  # importing must never need vllm
    assert {f.name: f.default for f in dataclasses.fields(ve.VLLMEngine.Options)}[
        "sleep_level"
    ] == 1


def _fake_vllm(monkeypatch, drop: str | None = None) -> None:
    """Fresh fake vLLM modules in sys.modules holding every API of VLLM_API, except ``drop``
    ("module.object" or "module.object.attribute"). EngineArgs is a dataclass whose fields have no
    class attribute and SamplingParams a class with msgspec's __struct_fields__ only: fields count
    as attributes."""
    for where in ve.VLLM_API:
        parts = where.split(":")[0].split(".")
        for i in range(1, len(parts) + 1):
            name = ".".join(parts[:i])
            monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["vllm"].__version__ = "9.9.9"
    for where, attributes in ve.VLLM_API.items():
        module, name = where.split(":")
        kept = [a for a in attributes if f"{module}.{name}.{a}" != drop]
        if name == "EngineArgs":
            obj = dataclasses.make_dataclass(name, kept)
        elif name == "SamplingParams":
            obj = type(name, (), {"__struct_fields__": tuple(kept)})
        else:
            obj = NS(**dict.fromkeys(kept))
        if f"{module}.{name}" != drop:
            setattr(sys.modules[module], name, obj)


def test_vllm_is_accepted_by_its_apis_not_its_version(monkeypatch):
    """check_vllm_api accepts any version that has every API of VLLM_API, and refuses one that
    lacks any single object or attribute with one line naming it and the installed version."""
    _fake_vllm(monkeypatch)
    ve.check_vllm_api()
    pieces = [f"{w.replace(':', '.')}.{a}" for w, attrs in ve.VLLM_API.items() for a in attrs]
    pieces += [w.replace(":", ".") for w in ve.VLLM_API]
    for drop in pieces:
        _fake_vllm(monkeypatch, drop)
        with pytest.raises(ValueError, match=f"^vLLM 9.9.9 lacks {re.escape(drop)}, ") as err:
            ve.check_vllm_api()
        assert "\n" not in str(err.value)


def test_vllm_api_lists_what_the_engine_calls():
    """VLLM_API covers the engine's source: every name imported from vllm, every method called on
    the LLM, every keyword of LLM(...) and SamplingParams(...), every attribute of the platform."""
    import ast
    import inspect

    api = {w: set(a) for w, a in ve.VLLM_API.items()}
    used = []  # (table key, attribute or "")
    for node in ast.walk(ast.parse(inspect.getsource(ve))):
        if isinstance(node, ast.ImportFrom) and node.module.split(".")[0] == "vllm":
            used += [(f"{node.module}:{a.name}", "") for a in node.names]
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Attribute) and owner.attr == "llm":
                used.append(("vllm:LLM", node.func.attr))
            if isinstance(owner, ast.Name) and owner.id == "vllm" and node.func.attr == "LLM":
                used += [("vllm.engine.arg_utils:EngineArgs", k.arg) for k in node.keywords]
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "SamplingParams":
            used += [("vllm:SamplingParams", k.arg) for k in node.keywords]
        if isinstance(node, ast.Attribute) and getattr(node.value, "id", "") == "platform":
            used.append(("vllm.platforms:current_platform", node.attr))
    assert len(used) > 30
    missing = [(w, a) for w, a in used if w not in api or (a and a not in api[w])]
    assert not missing


# --------------------------------------------------------------------------- weight names
def _tiny_qwen3():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3Config(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=8,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(cfg)


def test_weight_names_are_hf_names_without_wrappers_and_tied_head():
    """vLLM's Qwen3 load_weights takes HF names (it fuses q/k/v and gate/up itself): names pass
    unchanged, wrapper prefixes go, lm_head is dropped when tied, values are cast to bf16."""
    model = _tiny_qwen3()
    hf = dict(model.named_parameters())
    assert "lm_head.weight" not in hf  # tied: named_parameters already dedups it ...
    # ... some wrappers do not
    with_head = list(hf.items()) + [("lm_head.weight", model.lm_head.weight)]
    out = dict(ve.hf_to_vllm_weights(with_head, tie_word_embeddings=True, dtype=torch.bfloat16))
    assert set(out) == set(hf)
    assert (
        "model.layers.1.self_attn.q_proj.weight" in out
        and "model.layers.0.mlp.gate_proj.weight" in out
    )
    assert all(t.dtype == torch.bfloat16 and not t.requires_grad for t in out.values())
    wrapped = [
        (f"module._orig_mod.{n.replace('layers.0.', 'layers.0._checkpoint_wrapped_module.')}", t)
        for n, t in hf.items()
    ]
    assert set(dict(ve.hf_to_vllm_weights(wrapped, True))) == set(hf)
    untied = dict(ve.hf_to_vllm_weights(with_head, tie_word_embeddings=False))
    assert "lm_head.weight" in untied
    with pytest.raises(ValueError, match="appears twice"):
        list(ve.hf_to_vllm_weights([("module.a", torch.zeros(1)), ("a", torch.zeros(1))], False))
    with pytest.raises(ValueError, match="non-floating"):
        list(ve.hf_to_vllm_weights([("a", torch.zeros(1, dtype=torch.long))], False))


def test_buckets_respect_the_byte_limit_and_keep_order():
    named = [(f"w{i}", torch.zeros(n, dtype=torch.float32)) for i, n in enumerate([3, 3, 10, 1, 1])]
    got = [[name for name, _ in b] for b in ve.buckets(named, max_bytes=24)]
    assert got == [["w0", "w1"], ["w2"], ["w3", "w4"]]  # 12+12 | 40 alone | 4+4


def test_fused_parameter_names_and_checksums():
    """q/k/v land in vLLM's qkv_proj and gate/up in gate_up_proj: their checksums add up."""
    assert (
        ve.vllm_param_name("model.layers.3.self_attn.k_proj.weight")
        == "model.layers.3.self_attn.qkv_proj.weight"
    )
    assert (
        ve.vllm_param_name("model.layers.0.mlp.up_proj.weight")
        == "model.layers.0.mlp.gate_up_proj.weight"
    )
    assert (
        ve.vllm_param_name("model.layers.0.mlp.down_proj.weight")
        == "model.layers.0.mlp.down_proj.weight"
    )
    got = ve.fused_checksums({"a.q_proj.weight": (1.0, 2.0), "a.v_proj.weight": (0.5, 0.25),
                              "a.o_proj.weight": (3.0, 9.0)})
    assert got == {"a.qkv_proj.weight": (1.5, 2.25), "a.o_proj.weight": (3.0, 9.0)}


def test_checksum_is_invariant_to_fusing_qkv():
    q, k, v = torch.randn(8, 4), torch.randn(2, 4), torch.randn(2, 4)
    fused = torch.cat([q, k, v])
    a, b = ve.weights_checksum([q, k, v]), ve.weights_checksum([fused])
    assert ve.checksums_match(a, b, rtol=1e-12)
    assert not ve.checksums_match(a, ve.weights_checksum([q, k, v * 1.01]))


# --------------------------------------------------------------------------- log-prob extraction
def _lp(x):
    return NS(logprob=x, rank=1, decoded_token=None)


def _completion(index, ids, lps, extra=None):
    entries = [
        {t: _lp(lp)} | ({} if extra is None else {extra: _lp(-9.0)}) for t, lp in zip(ids, lps)
    ]
    return NS(index=index, token_ids=ids, logprobs=entries)


def test_sampled_logprobs_and_grouping_from_fake_outputs():
    eos = 2
    ro0 = NS(
        outputs=[
            _completion(1, [5, 6], [-0.5, -0.25], extra=9),
            _completion(0, [7, eos, 8], [-1.0, -2.0, -3.0]),
        ]
    )
    ro1 = NS(outputs=[_completion(0, [4], [-0.125]), _completion(1, [eos], [-4.0])])
    pairs = ve.outputs_to_pairs([ro0, ro1], n=2, eos_id=eos)
    assert pairs == [
        ([7, eos], [-1.0, -2.0]),
        ([5, 6], [-0.5, -0.25]),
        ([4], [-0.125]),
        ([eos], [-4.0]),
    ]
    with pytest.raises(ValueError, match="expected 3 completions"):
        ve.outputs_to_pairs([ro0], n=3, eos_id=eos)
    with pytest.raises(ValueError, match="no log-prob reported for the sampled token 6"):
        ve.sampled_logprobs(NS(token_ids=[5, 6], logprobs=[{5: _lp(-1.0)}, {7: _lp(-1.0)}]))
    with pytest.raises(ValueError, match="log-prob entries"):
        ve.sampled_logprobs(NS(token_ids=[5, 6], logprobs=None))
    plain = NS(token_ids=[3], logprobs=[{3: -0.75}])  # a float instead of a Logprob object
    assert ve.sampled_logprobs(plain) == [-0.75]


def test_prompt_logprobs_skip_the_first_position():
    ro = NS(prompt_logprobs=[None, {11: _lp(-1.5)}, {12: _lp(-0.5)}])
    assert ve.prompt_logprobs_of(ro, [10, 11, 12]) == [-1.5, -0.5]
    with pytest.raises(ValueError, match="expected 2 prompt log-prob entries"):
        ve.prompt_logprobs_of(ro, [10, 11])


# --------------------------------------------------------------------------- state machine
class FakeBackend:
    def __init__(self, checksum=(1.0, 2.0), probe=(-1.0, -2.0)):
        self.calls, self._checksum, self._probe = [], checksum, list(probe)

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags):
        self.calls.append(("wake_up", tags))

    def load(self, payload):
        self.calls.append(("load", list(payload)))
        return {"not_loaded": [], "received": {"a": self._checksum}}

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def checksums(self):
        self.calls.append(("checksum",))
        return {"a": self._checksum}

    def probe_logprobs(self, ids):
        self.calls.append(("probe", list(ids)))
        return self._probe

    def generate(self, *args):
        self.calls.append(("generate",))
        return "out"


def _sync(sm, checksum=(1.0, 2.0), trainer_lp=(-1.0, -2.01)):
    return sm.sync(["a"], {"a": checksum}, [1, 2, 3], list(trainer_lp))


def test_step_order_wake_generate_sleep_sync_verify():
    """The trainer's order: wake, generate, sleep (train), sync (wakes weights, loads, wakes KV,
    resets the prefix cache, verifies), generate again (evaluation) without another wake."""
    be = FakeBackend()
    sm = ve.EngineStateMachine(be, sleep_level=1, verify_tol=0.05)
    sm.wake()                                   # already awake after LLM(): no call
    assert sm.generate() == "out"
    sm.sleep()
    sm.sleep()                                  # idempotent
    with pytest.raises(RuntimeError, match="call wake"):
        sm.generate()
    info = _sync(sm)
    assert info["sync_logprob_diff"] == pytest.approx(0.005, abs=1e-12)
    assert sm.generate() == "out"
    assert be.calls == [("generate",), ("sleep", 1), ("wake_up", ["weights"]), ("load", ["a"]),
                        ("wake_up", ["kv_cache"]), ("reset_prefix_cache",), ("checksum",),
                        ("probe", [1, 2, 3]), ("generate",)]
    sm.sleep()
    sm.wake()
    assert be.calls[-2:] == [("sleep", 1), ("wake_up", None)]


def test_a_sync_that_did_not_take_effect_stops_with_an_error():
    sm = ve.EngineStateMachine(FakeBackend(checksum=(1.0, 2.0)), verify_tol=0.05)
    with pytest.raises(ve.WeightSyncError, match="checksum"):
        _sync(sm, checksum=(1.5, 2.0))
    with pytest.raises(RuntimeError, match="failed verification"):
        sm.generate()
    sm = ve.EngineStateMachine(FakeBackend(probe=(-1.0, -2.0)), verify_tol=0.05)
    with pytest.raises(ve.WeightSyncError, match="log-probs"):
        _sync(sm, trainer_lp=(-1.3, -2.0))      # mean |diff| 0.15 > 0.05
    with pytest.raises(RuntimeError, match="failed verification"):
        sm.generate()
    _sync(sm)                                   # a good sync re-enables generation
    assert sm.generate() == "out"


def test_bad_options():
    with pytest.raises(ValueError, match="sleep_level"):
        ve.EngineStateMachine(FakeBackend(), sleep_level=3)
    with pytest.raises(ValueError, match="verify_tol"):
        ve.EngineStateMachine(FakeBackend(), verify_tol=0)
    with pytest.raises(ValueError, match="differ in length"):
        ve.compare_logprobs([1.0], [1.0, 2.0], 0.1)


def test_engine_without_vllm_raises_a_clear_error(monkeypatch):
    """Without vLLM, building the engine stops with one line naming what to install."""
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm fails, installed or not
    with pytest.raises(ValueError, match="needs vLLM: pip install"):
        ve.VLLMEngine(torch.nn.Linear(1, 1), NS(eos_id=None), NS(engine_options={}, seed=0))


def test_probe_is_fixed_and_inside_the_vocabulary():
    """The sync's probe depends on the vocabulary size only (a resumed run probes as the
    uninterrupted one did), and every id is a valid token."""
    for V in (16, 32, 151_936):
        ids = ve.probe_ids(V)
        assert ids == ve.probe_ids(V) and len(ids) == 32 and all(0 <= i < V for i in ids)
        assert len(set(ids)) > min(V, 32) // 2
    with pytest.raises(ValueError, match="vocab_size"):
        ve.probe_ids(0)


@pytest.mark.parametrize("opt, msg", [
    ({"dtype": "fp8"}, "--vllm-dtype"), ({"enforce_eager": "yes"}, "--vllm-enforce-eager"),
    ({"gpu_memory_utilization": 0.0}, "--vllm-gpu-memory-utilization"),
    ({"sleep_level": 0}, "--vllm-sleep-level"), ({"verify_tol": -1.0}, "--vllm-verify-tol"),
    ({"max_model_len": -1}, "--vllm-max-model-len"), ({"bucket_mb": 0}, "--vllm-bucket-mb")])
def test_bad_engine_options_are_refused_with_the_flag_named(opt, msg):
    with pytest.raises(ValueError, match=f"bad configuration: {msg}"):
        ve.VLLMEngine.Options(**opt)


def test_engine_dtype_is_the_trainers_compute_dtype_if_the_platform_has_it():
    """--vllm-dtype auto: bf16 under bf16 autocast, else the parameters' dtype; a dtype the
    platform does not list is refused naming the ones it supports."""
    platform = NS(device_type="cpu", supported_dtypes=[torch.bfloat16, torch.float32])
    lin = torch.nn.Linear(2, 2)
    assert ve._engine_dtype("auto", lin, platform) == torch.float32
    wrapped = NS(autocast=True, parameters=lin.parameters)
    assert ve._engine_dtype("auto", wrapped, platform) == torch.bfloat16
    assert ve._engine_dtype("bfloat16", lin, platform) == torch.bfloat16
    with pytest.raises(ValueError, match=r"supports \['bfloat16', 'float32'\], not float16"):
        ve._engine_dtype("float16", lin, platform)
