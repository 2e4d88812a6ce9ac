"""The embedded model is converted once into a cache (plumbing.embedded_model_path). A run that converts
must draw the same numbers as a run that finds the cache: the conversion's random init of the plain model
used to advance torch's global RNG after the run had seeded it, so the first run on a new machine sampled
other rollouts than every later run (found by the digests of issue #47)."""
import torch

import plumbing


def test_converting_the_embedded_model_leaves_the_seeded_rng_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOSKILL_CACHE", str(tmp_path))
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    path = plumbing.embedded_model_path()  # converts: the cache folder is empty
    assert (tmp_path / "SmolLM2-135M-Instruct" / "config.json").exists() and path.startswith(str(tmp_path))
    assert torch.equal(torch.rand(4), expected)
    torch.manual_seed(0)
    plumbing.embedded_model_path()  # finds the cache
    assert torch.equal(torch.rand(4), expected)
