"""memory/lateload.py: the transformer's resident blocks whose home is the weight files are read by a thread while
the stage computes; each block waits for its own weights; the result is the synchronous load's, bit for bit; a
read error reaches the block that needed it and the stage still unloads cleanly. (CPU, the tiny transformer saved
in the real layout, the GPU plan applied on the CPU.)"""
from __future__ import annotations

import pytest
import torch
from diffusers.hooks import HookRegistry

import memory.lateload as lateload
from pipeline.components import load_components
from tests.model_helpers import file_transformer, resident_manager, step_inputs, two_steps


def test_blocks_read_late_give_the_same_step_and_each_waits_for_its_own(saved, monkeypatch):  # noqa: F811
    reference = load_components("tiny", "original").transformer
    inputs = step_inputs(reference, seed=5)
    expected = two_steps(reference, inputs)
    seen = []
    real_before = lateload.LateLoader.before

    def spy(self, i):
        real_before(self, i)
        seen.append((i, self.chunks[i].is_idle()))
    monkeypatch.setattr(lateload.LateLoader, "before", spy)

    for late in (False, True):
        tr, pack = file_transformer(saved)
        seen.clear()
        with resident_manager(pack, late).stage("transformer", transformer=tr) as rec:
            assert "resident" in rec.placement["transformer"]
            out = two_steps(tr, inputs)
            again = two_steps(tr, inputs)                      # the second step: the hooks only check
        assert all(torch.equal(a, b) for a, b in zip(out, expected)), late
        assert all(torch.equal(a, b) for a, b in zip(again, expected)), late
        if late:
            late_blocks = len(pack.blocks) - 1            # block 0 is loaded with the stage (TeaCache reads it)
            assert [i for i, _ in seen] == list(range(late_blocks)) * 4          # 4 passes
            assert not any(idle for _, idle in seen)       # bound to its read weights before the block ran
        else:
            assert not seen
        assert rec.file_bytes == sum(c.file_bytes for c in pack.chunks)
        assert pack.intact() and pack.host_bytes == 0 and all(c.home == "file" for c in pack.chunks)
        assert all(HookRegistry.check_if_exists_or_initialize(m).get_hook(lateload.HOOK_NAME) is None
                   for m in pack.block_modules)


def test_a_read_error_reaches_the_block_and_the_stage_unloads(saved, monkeypatch):  # noqa: F811
    tr, pack = file_transformer(saved)
    inputs = step_inputs(load_components("tiny", "original").transformer, seed=6)

    def broken(chunk, buf, staging):
        raise OSError(5, "Input/output error", "diffusion_pytorch_model.safetensors")
    monkeypatch.setattr(lateload, "fill_from_files", broken)
    mm = resident_manager(pack, True)
    with pytest.raises(OSError, match="Input/output error"):
        with mm.stage("transformer", transformer=tr):
            two_steps(tr, inputs)
    assert mm.loaded() == [] and pack.intact() and all(c.is_idle() for c in pack.chunks)


def test_the_environment_can_turn_the_memory_switches_off_for_a_run(monkeypatch):
    import argparse

    from configs.options import add_process_options, config_from

    parser = argparse.ArgumentParser()
    add_process_options(parser)

    def config():
        return config_from(parser, parser.parse_args([]))

    assert (config().late_load, config().park, config().direct_io) == (True, True, True)      # MemoryConfig's
    monkeypatch.setenv("STEADYFRAME_LATE_LOAD", "0")
    monkeypatch.setenv("STEADYFRAME_PARK", "off")
    monkeypatch.setenv("STEADYFRAME_DIRECT_IO", "no")
    options = config().memory_options()
    assert (options["late_load"], options["park"], options["direct_io"]) == (False, False, False)
    monkeypatch.setenv("STEADYFRAME_PARK", "maybe")                      # not a switch: the configured value holds
    assert config().park is True
