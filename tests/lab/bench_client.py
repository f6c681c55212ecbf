"""The real `vllm bench serve` for the bench tests: vLLM 0.25.0 from PyPI in a venv of this machine
(cached; ~9.5 GB with torch, ~3 min to install), shown read-only to the test hosts at the same path,
and a small word-level tokenizer for its random dataset (no model can be downloaded here)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.lab.rootfs import cache_dir, cache_lock

VLLM_VERSION = "0.25.0"
TOKENIZER_WORDS = 2000

MAKE_TOKENIZER = r"""
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast
words = int(sys.argv[2])
vocab = {"<unk>": 0, **{f"w{i}": i + 1 for i in range(words)}}
tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tokenizer.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="<unk>").save_pretrained(sys.argv[1])
"""


def ensure_bench_vllm() -> Path:
    """The venv (its folder) holding the real vLLM; built once."""
    venv = cache_dir() / f"bench-vllm-{VLLM_VERSION}"
    done = venv / ".complete"
    with cache_lock(venv.name):
        if not done.exists():
            # Debian's own Python: the test hosts (bookworm) run the venv with theirs, at the same path
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", str(venv)], check=True)
            subprocess.run([str(venv / "bin/pip"), "install", "-q", "--disable-pip-version-check",
                            f"vllm=={VLLM_VERSION}"], check=True)
            done.write_text("")
    return venv.resolve()  # the path its scripts' #! lines name: hosts see it there


def ensure_tokenizer(venv: Path) -> Path:
    """A word-level tokenizer folder (w0 … w1999), made with the venv's transformers."""
    folder = cache_dir() / "bench-tokenizer"
    with cache_lock(folder.name):
        if not (folder / "tokenizer.json").exists():
            subprocess.run([str(venv / "bin/python"), "-c", MAKE_TOKENIZER, str(folder), str(TOKENIZER_WORDS)],
                           check=True)
    return folder


def boot_bench_host(lab, name: str, folder: Path, api_key: str):
    """A test host that sees the real vLLM's venv and the tokenizer read-only, with the TEST DOUBLE
    nvidia-smi; the instance's API key in folder/chat.key. Returns (host, venv, tokenizer, key file)."""
    from tests.lab.specs import install_standin

    venv = ensure_bench_vllm()
    tokenizer = ensure_tokenizer(venv)
    host = lab.boot(name, binds=(str(venv), str(tokenizer)))
    install_standin(host)
    key_file = folder / "chat.key"
    key_file.write_text(api_key + "\n")
    return host, venv, tokenizer, key_file
