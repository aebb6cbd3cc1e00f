"""The installer (scripts/install.py, issue 31 item 12): its decisions under simulated machines (Linux, Windows,
WSL2, macOS; NVIDIA, AMD RDNA3/RDNA2, none; torch installed or not), its detection fed fake tools, and its run order
with fake commands. Nothing is installed and nothing touches the network."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("steadyframe_install", ROOT / "scripts" / "install.py")
inst = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = inst                  # dataclasses look their module up while the class is made
_spec.loader.exec_module(inst)

NVIDIA = inst.Gpu("nvidia", "NVIDIA GeForce RTX 4090")
RDNA3 = inst.Gpu("amd", "AMD Radeon RX 7900 XTX", "gfx1100")
RDNA2 = inst.Gpu("amd", "AMD Radeon RX 6800 XT", "gfx1030")
CARDS = {"nvidia": (NVIDIA,), "rdna3": (RDNA3,), "rdna2": (RDNA2,), "none": ()}
PLACES = {"linux": dict(os="linux"), "windows": dict(os="windows"), "wsl": dict(os="linux", wsl=True)}
CPU_ARGS = ["install", "torch==2.13.0+cpu", "--index-url", "https://download.pytorch.org/whl/cpu",
            "--extra-index-url", "https://pypi.org/simple"]
CU128 = "https://download.pytorch.org/whl/cu128"
ROCM64 = "https://download.pytorch.org/whl/rocm6.4"
THEROCK = "https://rocm.nightlies.amd.com/whl-multi-arch/"

# (place, card) -> (build, index URL, the torch requirement)
EXPECTED = {
    ("linux", "nvidia"): ("cuda", CU128, "torch"),
    ("linux", "rdna3"): ("rocm", ROCM64, "torch"),
    ("linux", "rdna2"): ("rocm", ROCM64, "torch"),
    ("linux", "none"): ("cpu", "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"),
    ("windows", "nvidia"): ("cuda", CU128, "torch"),
    ("windows", "rdna3"): ("rocm-windows", THEROCK, "torch[device-gfx1100]"),
    ("windows", "rdna2"): ("cpu", "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"),
    ("windows", "none"): ("cpu", "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"),
    ("wsl", "nvidia"): ("cuda", CU128, "torch"),
    ("wsl", "rdna3"): ("rocm", ROCM64, "torch"),
    ("wsl", "rdna2"): ("rocm", ROCM64, "torch"),
    ("wsl", "none"): ("cpu", "https://download.pytorch.org/whl/cpu", "torch==2.13.0+cpu"),
}


def machine(place="linux", card="none", torch=None, online=True) -> "inst.Machine":
    return inst.Machine(gpus=CARDS[card], torch=torch, online=online, **PLACES[place])


@pytest.mark.parametrize("place,card", sorted(EXPECTED))
def test_without_torch_the_build_is_picked_for_the_machine(place, card):
    build, index, requirement = EXPECTED[place, card]
    p = inst.plan(machine(place, card), inst.Options())
    assert (p.build, p.index_url, p.torch_install[1]) == (build, index, requirement), p
    assert p.error is None and p.project_install == ["install", "-e", "."]
    if build == "cpu":
        assert p.torch_install == CPU_ARGS                      # exactly what scripts/install.sh ran before
    text = " ".join(p.messages)
    if place == "wsl" and build == "rocm":
        assert "WSL" in text and "librocdxg" in text and inst.WSL_ROCM_GUIDE in text
    if build == "rocm-windows":
        assert "nightly" in text and "Adrenalin" in text


def test_windows_with_an_older_amd_card_gets_the_cpu_build_and_says_why_and_what_to_do():
    p = inst.plan(machine("windows", "rdna2"), inst.Options())
    assert p.build == "cpu" and p.torch_install == CPU_ARGS
    text = " ".join(p.messages)
    for words in ("AMD Radeon RX 6800 XT (gfx1030)", "RDNA3/RDNA4", "CPU build instead", "Linux with ROCm",
                  "WSL2", "--torch rocm"):
        assert words in text, (words, text)
    # an AMD adapter whose architecture is unknown: the same fallback, and how to name the card
    unknown = inst.Machine(os="windows", gpus=(inst.Gpu("amd", "AMD Radeon(TM) Graphics"),))
    p = inst.plan(unknown, inst.Options())
    assert p.build == "cpu" and "could not tell" in " ".join(p.messages) and "--gfx" in " ".join(p.messages)
    # ... named with --gfx: TheRock's wheels for that card
    p = inst.plan(unknown, inst.Options(gfx="gfx1201"))
    assert (p.build, p.torch_install[1], p.index_url) == ("rocm-windows", "torch[device-gfx1201]", THEROCK)


@pytest.mark.parametrize("installed", ["2.13.0+cpu", "2.9.1+cu128", "2.8.0+rocm6.4", "2.10.0+rocm7.13.0a20260416",
                                       "2.13.0"])
@pytest.mark.parametrize("choice", inst.BUILDS)
def test_an_installed_torch_is_never_replaced(installed, choice):
    for place in PLACES:
        for card in CARDS:
            p = inst.plan(machine(place, card, torch=installed), inst.Options(torch=choice, dev=True))
            assert p.build == "keep" and p.torch_install is None and p.error is None, (place, card, p)
            assert p.project_install == ["install", "-e", ".[dev]"]
            assert f"keeping the installed PyTorch {installed}" in p.messages[0]
            if choice in ("cpu", "cuda", "rocm") and inst.torch_build(installed) != choice:
                assert "never replaced" in " ".join(p.messages) and "pip uninstall" in " ".join(p.messages)


def test_a_cpu_torch_on_a_gpu_machine_is_kept_with_a_hint():
    p = inst.plan(machine("linux", "nvidia", torch="2.13.0+cpu"), inst.Options())
    assert p.torch_install is None and "NVIDIA GeForce RTX 4090" in p.messages[1] and "uninstall" in p.messages[1]
    assert len(inst.plan(machine("linux", "nvidia", torch="2.9.1+cu128"), inst.Options()).messages) == 1


def test_torch_build_names():
    assert [inst.torch_build(v) for v in ("2.13.0+cpu", "2.9.1+cu128", "2.8.0+rocm6.4", "2.7.0a0+rocmsdk20250608",
                                          "2.13.0", "2.13.0+cpu.cxx11.abi")] == [
        "cpu", "cuda", "rocm", "rocm", "unknown", "cpu"]


def test_the_torch_option_overrides_detection():
    o = inst.Options
    assert inst.plan(machine("linux", "nvidia"), o(torch="cpu")).torch_install == CPU_ARGS
    assert inst.plan(machine("linux", "none"), o(torch="cuda")).index_url == CU128
    assert inst.plan(machine("windows", "none"), o(torch="cuda", cuda="cu126")).index_url.endswith("/cu126")
    assert inst.plan(machine("linux", "nvidia"), o(torch="rocm", rocm="rocm6.3")).index_url.endswith("/rocm6.3")
    assert inst.plan(machine("linux", "rdna3"), o(torch_version="2.8.0")).torch_install[1] == "torch==2.8.0"
    # Windows: --torch rocm takes an older card too (with a warning), and asks which card when none is known
    p = inst.plan(machine("windows", "rdna2"), o(torch="rocm"))
    assert (p.build, p.torch_install[1]) == ("rocm-windows", "torch[device-gfx1030]") and "warning" in p.messages[1]
    p = inst.plan(machine("windows", "none"), o(torch="rocm"))
    assert p.torch_install is None and "--gfx" in p.error
    p = inst.plan(machine("windows", "rdna3"), o(torch="rocm", rocm_windows_index="https://example.org/idx/"))
    assert p.index_url == "https://example.org/idx/"
    # keep without a torch, CUDA/ROCm on macOS: refused with a reason
    assert "--torch keep" in inst.plan(machine(), o(torch="keep")).error
    mac = inst.Machine(os="darwin")
    assert "macOS" in inst.plan(mac, o(torch="cuda")).error
    assert inst.plan(mac, o()).torch_install == ["install", "torch==2.13.0"]            # PyPI's (MPS) build
    assert inst.plan(mac, o(torch="cpu")).torch_install == ["install", "torch==2.13.0"]


def test_offline_the_cpu_build_comes_from_pips_own_indexes():
    p = inst.plan(machine(online=False), inst.Options(cpu_version="2.12.1"))
    assert p.torch_install == ["install", "torch==2.12.1+cpu"]          # as scripts/install.sh did offline
    assert "does not resolve" in p.messages[-1]
    p = inst.plan(machine("linux", "nvidia", online=False), inst.Options())
    assert p.index_url == CU128 and "warning" in p.messages[-1]


def test_both_vendors_prefer_nvidia_and_say_so():
    m = inst.Machine(os="linux", gpus=(inst.Gpu("amd", "", "gfx1036"), NVIDIA))
    p = inst.plan(m, inst.Options())
    assert p.build == "cuda" and "--torch rocm" in p.messages[0]


# -------------------------------------------------------------------------------------------------- detection

def fake_tools(outputs: dict):
    """A command runner that answers from a table keyed by the command's first word (None: missing tool)."""
    calls = []

    def run(cmd, timeout=20):
        calls.append(list(cmd))
        return outputs.get(Path(cmd[0]).name)
    run.calls = calls
    return run


def make_topology(root: Path, *versions: int) -> Path:
    """A fake /sys/class/kfd/kfd/topology/nodes: a CPU node 0 (gfx_target_version 0), then one node per GPU."""
    for i, version in enumerate((0, *versions)):
        (root / "nodes" / str(i)).mkdir(parents=True)
        (root / "nodes" / str(i) / "properties").write_text(f"cpu_cores_count {16 if i == 0 else 0}\n"
                                                            f"gfx_target_version {version}\nvendor_id 4098\n")
    return root / "nodes"


def test_kfd_topology_names_the_amd_gpus(tmp_path):
    nodes = make_topology(tmp_path, 110000, 90010, 120001)             # gfx1100, gfx90a, gfx1201
    assert [g.gfx for g in inst.kfd_gpus(nodes)] == ["gfx1100", "gfx90a", "gfx1201"]
    assert inst.kfd_gpus(tmp_path / "missing") == []
    assert [inst.gfx_from_target_version(v) for v in (110000, 90010, 100300, 110501, 0)] == [
        "gfx1100", "gfx90a", "gfx1030", "gfx1151", None]
    gpus = inst.detect_gpus("linux", False, fake_tools({}), kfd=nodes)
    assert [(g.vendor, g.gfx) for g in gpus] == [("amd", "gfx1100"), ("amd", "gfx90a"), ("amd", "gfx1201")]


def test_nvidia_smi_and_rocminfo_are_read_and_missing_tools_find_nothing(tmp_path):
    smi = ("GPU 0: NVIDIA GeForce RTX 4090 (UUID: GPU-0b1c)\nGPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-77aa)\n")
    rocminfo = ("Agent 1\n  Name:                    AMD Ryzen 9 7950X\n  Marketing Name:          AMD Ryzen 9\n"
                "Agent 2\n  Name:                    gfx1100\n  Marketing Name:          AMD Radeon RX 7900 XTX\n"
                "  ISA 1\n    Name:                    amdgcn-amd-amdhsa--gfx1100\n")
    run = fake_tools({"nvidia-smi": smi, "rocminfo": rocminfo})
    gpus = inst.detect_gpus("linux", False, run, kfd=tmp_path / "no-kfd")
    assert [(g.vendor, g.name or g.gfx) for g in gpus] == [
        ("nvidia", "NVIDIA GeForce RTX 4090"), ("nvidia", "NVIDIA H100 80GB HBM3"), ("amd", "gfx1100")]
    assert inst.detect_gpus("linux", False, fake_tools({}), kfd=tmp_path / "no-kfd") == ()
    assert inst.detect_gpus("windows", False, fake_tools({}), env={}) == ()
    assert inst.detect_gpus("darwin", False, fake_tools({"nvidia-smi": smi})) == ()
    # the real runner: a missing tool, a failing one and a hanging one are all "not found"
    assert inst.capture(["steadyframe-no-such-tool-xyz"]) is None
    assert inst.capture([sys.executable, "-c", "raise SystemExit(3)"]) is None
    assert inst.capture([sys.executable, "-c", "import time; time.sleep(5)"], timeout=0.2) is None
    assert inst.capture([sys.executable, "-c", "print('GPU 0: x')"]) == "GPU 0: x\n"


def test_windows_adapters_name_the_cards_and_hip_tools_their_architecture():
    adapters = "AMD Radeon RX 7900 XTX\r\nAMD Radeon(TM) Graphics\r\nMicrosoft Basic Display Adapter\r\n"
    run = fake_tools({"powershell": adapters})
    gpus = inst.detect_gpus("windows", False, run, env={})
    assert [(g.vendor, g.name, g.gfx) for g in gpus] == [("amd", "AMD Radeon RX 7900 XTX", "gfx1100"),
                                                         ("amd", "AMD Radeon(TM) Graphics", None)]
    assert inst.plan(inst.Machine(os="windows", gpus=gpus), inst.Options()).torch_install[1] == \
        "torch[device-gfx1100]"
    # no PowerShell: wmic's table; NVIDIA named by the adapter when nvidia-smi is missing
    run = fake_tools({"wmic": "Name\r\nNVIDIA GeForce RTX 3090\r\nAMD Radeon RX 6800\r\n"})
    gpus = inst.detect_gpus("windows", False, run, env={})
    assert [(g.vendor, g.gfx) for g in gpus] == [("nvidia", None), ("amd", "gfx1030")]
    # the HIP SDK's hipInfo (under HIP_PATH) says the architecture, whatever the adapter's name
    run = fake_tools({"hipInfo.exe": "device#  0\nName: AMD Radeon PRO W7800\ngcnArchName: gfx1100\n",
                      "powershell": "AMD Radeon PRO W7800\n"})
    gpus = inst.detect_gpus("windows", False, run, env={"HIP_PATH": "C:/Program Files/AMD/ROCm/6.4"})
    assert [(g.name, g.gfx) for g in gpus] == [("AMD Radeon PRO W7800", "gfx1100")]
    assert [inst.gfx_from_name(n) for n in ("AMD Radeon RX 9070 XT", "AMD Radeon RX 7600 XT", "AMD Radeon 780M",
                                            "AMD Radeon(TM) 8060S Graphics", "Radeon RX 580")] == [
        "gfx1201", "gfx1102", "gfx1103", "gfx1151", None]


def test_wsl_is_recognised_and_asks_windows_for_the_adapters(tmp_path):
    assert inst.is_wsl("6.6.87.2-microsoft-standard-WSL2", tmp_path / "dxg") is True
    assert inst.is_wsl("6.8.0-generic", tmp_path / "dxg") is False
    (tmp_path / "dxg").write_text("")
    assert inst.is_wsl("6.8.0-generic", tmp_path / "dxg") is True
    run = fake_tools({"powershell.exe": "AMD Radeon RX 7900 XT\n"})
    gpus = inst.detect_gpus("linux", True, run, kfd=tmp_path / "no-kfd")
    assert [(g.vendor, g.gfx) for g in gpus] == [("amd", "gfx1100")]
    assert ["/usr/lib/wsl/lib/nvidia-smi", "-L"] in run.calls


# -------------------------------------------------------------------------------------------------- running

def test_run_order_stamp_and_a_failing_pip(tmp_path, monkeypatch, capsys):
    """main() with fake commands: torch, then the project, then the guard, then the stamp; the second run does
    nothing; a failing pip stops with a message and a non-zero exit."""
    prefix = tmp_path / "env"
    prefix.mkdir()
    ran = []

    def run(cmd, timeout=20):
        return f"{prefix}\n" if cmd[-1] == "import sys; print(sys.prefix)" else None

    def execute(cmd):
        ran.append(cmd[1:])
        return 0

    argv = ["--python", "fake-python", "--dev"]
    m = inst.Machine(os="linux", gpus=(NVIDIA,))
    assert inst.main(argv, machine=m, run=run, execute=execute) == 0
    assert [c[:3] for c in ran] == [["-m", "pip", "install"], ["-m", "pip", "install"], ["-c", inst.GUARD]]
    assert ran[0][3:] == ["torch", "--index-url", CU128] and ran[1][3:] == ["-e", ".[dev]"]
    assert (prefix / ".steadyframe-install-dev").read_text().strip() == inst.stamp_value()

    ran.clear()
    assert inst.main(argv, machine=inst.Machine(os="linux", torch="2.9.1+cu128"), run=run, execute=execute) == 0
    assert ran == [] and "nothing to do" in capsys.readouterr().out

    ran.clear()
    assert inst.main(argv + ["--dry-run"], machine=m, run=run, execute=execute) == 0
    out = capsys.readouterr().out
    assert ran == [] and "fake-python -m pip install torch --index-url " + CU128 in out

    (prefix / ".steadyframe-install-dev").unlink()
    assert inst.main(argv, machine=m, run=run, execute=lambda cmd: ran.append(cmd) or 1) == 1
    out = capsys.readouterr().out
    assert len(ran) == 1 and "pip failed (exit 1) installing PyTorch (cuda)" in out
    assert not (prefix / ".steadyframe-install-dev").exists()


def test_dry_run_on_this_machine_installs_nothing(tmp_path):
    """`python scripts/install.py --dry-run --torch cpu`, its interpreter a stand-in that logs any pip call."""
    log = tmp_path / "pip.log"
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nif [ \"$1\" = -m ] && [ \"$2\" = pip ]; then echo \"$@\" >> {log}; exit 0; fi\n"
                    f"exec {sys.executable} \"$@\"\n")
    fake.chmod(0o755)
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "install.py"), "--dry-run", "--torch", "cpu",
                        "--python", str(fake)], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, TORCH_CPU_VERSION="2.13.0"))
    assert r.returncode == 0, r.stderr
    assert "install: dry run: nothing is installed" in r.stdout and "PyTorch:" in r.stdout
    assert not log.exists()
    # a torch is installed here (the test suite runs on it): it is kept, whatever --torch asks
    assert "keeping the installed PyTorch" in r.stdout and "-m pip install torch" not in r.stdout
