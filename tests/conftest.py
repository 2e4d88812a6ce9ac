"""Shared fixtures: the repo on sys.path, a tiny randomly initialised model for mechanics tests."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# a test subprocess's thread settings: one thread per process (per rank under torchrun). torch takes its thread
# count from MKL_NUM_THREADS when that is set, so OMP_NUM_THREADS alone can leave two ranks at 2 threads each on 2 cores
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A 2-layer Llama with the embedded model's tokenizer, saved as an HF folder (fast on CPU)."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    import plumbing
    tok = AutoTokenizer.from_pretrained(plumbing.embedded_model_path())
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg)
    out = tmp_path_factory.mktemp("tiny_model")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return str(out)


def pytest_configure(config):
    """Skipped tests say why in the summary line (e.g. the sandbox's kernel layers without root or bubblewrap).
    The `multirank` marker names every test that starts torchrun ranks (bench/multirank_repeat.py runs them)."""
    config.addinivalue_line("markers", "multirank: starts two or more torchrun ranks (bench/multirank_repeat.py)")
    config.addinivalue_line("markers", "heavy(seconds): this test's measured seconds under make test (one thread); it starts early")
    if not set("sA") & set(config.option.reportchars):
        config.option.reportchars += "s"


def _seconds(item):
    mark = item.get_closest_marker("heavy")
    return mark.args[0] if mark else 0


def pytest_collection_modifyitems(config, items):
    """Longest test first, so `make test` (two xdist workers, one thread each, --maxschedchunk 1) starts the two
    longest at once, one per worker, and fills the rest around them. xdist hands each worker two tests at the
    start (items 0-1 and 2-3), so slot 1 gets a light test and the second-longest opens worker 2. The rest keep
    file order (a stable sort); without xdist the order only moves the heavy tests to the front."""
    items.sort(key=_seconds, reverse=True)
    light = next((i for i, it in enumerate(items) if _seconds(it) == 0), None)
    if light is not None and light > 1:
        items.insert(1, items.pop(light))
