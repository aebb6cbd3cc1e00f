"""The installer (scripts/install.py, issues 31 and 40): its table under simulated machines (Linux, Windows, WSL2,
macOS on Apple Silicon and Intel; NVIDIA with old and new drivers, AMD RDNA1-4, MI300, MI350, iGPUs, none; Python
3.10-3.15; torch installed or not), its detection fed fake tools, and its run order with fake commands. Nothing is installed and nothing touches the network."""
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

CPU_ARGS = ["install", "torch==2.13.0+cpu", "--index-url", "https://download.pytorch.org/whl/cpu",
            "--extra-index-url", "https://pypi.org/simple"]
CU130 = "https://download.pytorch.org/whl/cu130"
CU126 = "https://download.pytorch.org/whl/cu126"
ROCM72 = "https://download.pytorch.org/whl/rocm7.2"
THEROCK = "https://repo.amd.com/rocm/whl-multi-arch/"
THEROCK_NIGHTLY = "https://rocm.nightlies.amd.com/whl-multi-arch/"

# The simulated cards: (GPUs, the driver's CUDA version as nvidia-smi's header says it)
ADA = inst.Gpu("nvidia", "NVIDIA GeForce RTX 4090", cc=(8, 9))
NVIDIA = ADA
BLACKWELL = inst.Gpu("nvidia", "NVIDIA GeForce RTX 5090", cc=(12, 0))
CARDS = {
    "ada-driver-13.0": ((ADA,), (13, 0)),
    "ada-driver-12.4": ((ADA,), (12, 4)),
    "ada-driver-11.8": ((ADA,), (11, 8)),
    "blackwell-driver-13.0": ((BLACKWELL,), (13, 0)),
    "blackwell-driver-12.8": ((BLACKWELL,), (12, 8)),
    "pascal-driver-13.0": ((inst.Gpu("nvidia", "NVIDIA GeForce GTX 1080 Ti", cc=(6, 1)),), (13, 0)),
    "rdna1": ((inst.Gpu("amd", "AMD Radeon RX 5700 XT", "gfx1010"),), None),
    "rdna2": ((inst.Gpu("amd", "AMD Radeon RX 6800 XT", "gfx1030"),), None),
    "rdna3": ((inst.Gpu("amd", "AMD Radeon RX 7900 XTX", "gfx1100"),), None),
    "rdna3.5": ((inst.Gpu("amd", "AMD Radeon 8060S", "gfx1151"),), None),
    "rdna4": ((inst.Gpu("amd", "AMD Radeon RX 9070 XT", "gfx1201"),), None),
    "mi300": ((inst.Gpu("amd", "AMD Instinct MI300X", "gfx942"),), None),
    "mi350": ((inst.Gpu("amd", "AMD Instinct MI355X", "gfx950"),), None),
    "igpu": ((inst.Gpu("amd", "AMD Radeon(TM) Graphics", "gfx1036"),), None),
    "vega-igpu": ((inst.Gpu("amd", "AMD Radeon(TM) Vega 8 Graphics", "gfx90c"),), None),
    "none": ((), None),
}
PLACES = {"linux": dict(os="linux"), "windows": dict(os="windows"), "wsl": dict(os="linux", wsl=True)}
PYTHONS = [(3, 10), (3, 11), (3, 12), (3, 13), (3, 14), (3, 15)]


def pip(requirement, index=None, *extra):
    return ["install", requirement, *extra] + (["--index-url", index] if index else [])


CU130_ARGS, CU126_ARGS = pip("torch==2.13.0", CU130), pip("torch==2.13.0", CU126)
ROCM_ARGS = pip("torch==2.13.0", ROCM72)
# (place, card) -> the exact pip arguments for torch, written out by hand from the sources named in WHEELS
EXPECTED = {}
for _place in PLACES:
    EXPECTED.update({
        (_place, "ada-driver-13.0"): CU130_ARGS,
        (_place, "ada-driver-12.4"): CU126_ARGS,         # a 12.x driver runs CUDA 12.6 (minor-version compat)
        (_place, "ada-driver-11.8"): CPU_ARGS,           # too old for both: the CPU build
        (_place, "blackwell-driver-13.0"): CU130_ARGS,
        (_place, "blackwell-driver-12.8"): CPU_ARGS,     # cu126 has no sm_120; cu130 needs a 580 driver
        (_place, "pascal-driver-13.0"): CU126_ARGS,      # CUDA 13 has no Pascal code
        (_place, "none"): CPU_ARGS,
    })
    for _card in ("rdna1", "rdna2", "rdna3", "rdna3.5", "rdna4", "mi300", "mi350", "igpu", "vega-igpu"):
        EXPECTED[_place, _card] = ROCM_ARGS                             # Linux and WSL2: PyTorch's ROCm 7.2
EXPECTED.update({
    ("windows", "rdna1"): pip("torch[device-gfx1010]==2.13.0", THEROCK),
    ("windows", "rdna2"): pip("torch[device-gfx1030]==2.13.0", THEROCK),
    ("windows", "rdna3"): pip("torch[device-gfx1100]==2.13.0", THEROCK),
    ("windows", "rdna3.5"): pip("torch[device-gfx1151]==2.13.0", THEROCK),
    ("windows", "rdna4"): pip("torch[device-gfx1201]==2.13.0", THEROCK),
    ("windows", "igpu"): pip("torch[device-gfx1036]==2.13.0", THEROCK),       # Raphael's RDNA2 iGPU
    ("windows", "mi300"): CPU_ARGS,                  # no Windows wheels for Instinct cards, nor for Vega
    ("windows", "mi350"): CPU_ARGS,
    ("windows", "vega-igpu"): CPU_ARGS,
})


def machine(place="linux", card="none", torch=None, online=True, python=(3, 12), arch="x86_64") -> "inst.Machine":
    gpus, cuda = CARDS[card]
    return inst.Machine(gpus=gpus, torch=torch, online=online, python=python, arch=arch, cuda_driver=cuda,
                        **PLACES[place])


@pytest.mark.parametrize("place,card", sorted(EXPECTED))
def test_every_row_under_every_python(place, card):
    """Each simulated machine x Python 3.10-3.15: the exact pip command, or (a Python with no wheel) a message and
    no command."""
    for python in PYTHONS:
        p = inst.plan(machine(place, card, python=python), inst.Options())
        if p.row == "amd-windows-therock" and python == (3, 15):       # TheRock builds 3.10-3.14
            assert p.torch_install is None and "Python 3.15" in p.error and "3.10 to 3.14" in p.error, p
            continue
        assert p.error is None and p.torch_install == EXPECTED[place, card], (python, p)
        assert p.project_install == ["install", "-e", "."]
    text = " ".join(inst.plan(machine(place, card), inst.Options()).messages)
    if card == "ada-driver-11.8":
        assert ("528.33" if place == "windows" else "525.60.13") + " or newer" in text, text
    if card == "blackwell-driver-12.8":
        assert ("580.88" if place == "windows" else "580.65.06") in text and "CUDA 13.0" in text, text
    if place == "wsl" and EXPECTED[place, card] == ROCM_ARGS:
        assert "librocdxg" in text and inst.WSL_ROCM_GUIDE in text
    if place == "windows" and card in ("mi300", "mi350", "vega-igpu"):
        assert "RDNA1-RDNA4" in text and "CPU build instead" in text and "Linux with ROCm" in text


def test_every_row_names_its_source_and_is_reached():
    """The table is the one place: every row has a source, and some simulated machine reaches it."""
    reached = {inst.plan(machine(place, card), inst.Options()).row for place, card in EXPECTED}
    reached |= {inst.plan(inst.Machine(os="darwin", arch=a), inst.Options()).row for a in ("arm64", "x86_64")}
    for row in inst.WHEELS:
        assert row.source and row.name in reached, row
    source = (ROOT / "scripts" / "install.py").read_text()
    table = source[source.index("\nWHEELS = ("):source.index("\n)\n", source.index("\nWHEELS = ("))]
    assert table.count("Wheel(") == len(inst.WHEELS) and table.count("source=") == len(inst.WHEELS)


@pytest.mark.parametrize("python", PYTHONS + [(3, 16), (3, 9)])
def test_macs_and_pythons_out_of_range(python):
    arm = inst.plan(inst.Machine(os="darwin", arch="arm64", python=python), inst.Options())
    intel = inst.plan(inst.Machine(os="darwin", arch="x86_64", python=python), inst.Options())
    linux = inst.plan(machine(python=python), inst.Options())
    if python in PYTHONS:
        assert arm.error is None and arm.torch_install == ["install", "torch==2.13.0"]
        assert "Apple Silicon" in arm.messages[0] and "MPS" in arm.messages[0]
        assert linux.torch_install == CPU_ARGS
    else:
        for p in (arm, linux):
            assert p.torch_install is None and f"Python {python[0]}.{python[1]}" in p.error and "venv" in p.error
    if python >= (3, 10):                   # an Intel Mac, whatever the Python: refused, naming what works
        assert intel.torch_install is None and "Intel Mac" in intel.error and "Apple Silicon" in intel.error
        assert "Linux or Windows" in intel.error


def test_python_out_of_range_stops_before_anything_installs(capsys):
    ran = []
    m = machine("linux", "ada-driver-13.0", python=(3, 16))
    assert inst.main(["--python", "fake-python"], machine=m, run=lambda cmd, timeout=20: None,
                     execute=lambda cmd: ran.append(cmd) or 0) == 2
    assert ran == [] and "has wheels for Python 3.10 to 3.15 only" in capsys.readouterr().out


def test_windows_amd_nightly_only_behind_the_flag():
    p = inst.plan(machine("windows", "rdna3"), inst.Options(nightly=True))
    assert p.torch_install == ["install", "torch[device-gfx1100]", "--pre", "--index-url", THEROCK_NIGHTLY]
    assert "--nightly" in " ".join(p.messages)
    p = inst.plan(machine("windows", "rdna3"), inst.Options(nightly=True, torch_version="2.14.0"))
    assert p.torch_install[1] == "torch[device-gfx1100]==2.14.0"
    assert inst.plan(machine("linux", "rdna3"), inst.Options(nightly=True)).torch_install == ROCM_ARGS


def test_driver_unknown_is_assumed_current_for_the_family():
    p = inst.plan(inst.Machine(os="linux", gpus=(ADA,)), inst.Options())
    assert p.torch_install == CU126_ARGS and "could not read the driver's CUDA version" in p.messages[0]
    m = inst.Machine(os="linux", gpus=(inst.Gpu("nvidia", "NVIDIA GeForce RTX 5080"),))    # cc from the name
    assert inst.plan(m, inst.Options()).torch_install == CU130_ARGS


def test_windows_with_an_unsupported_amd_card_gets_the_cpu_build_and_says_why_and_what_to_do():
    p = inst.plan(machine("windows", "vega-igpu"), inst.Options())
    assert p.build == "cpu" and p.torch_install == CPU_ARGS
    text = " ".join(p.messages)
    for words in ("AMD Radeon(TM) Vega 8 Graphics (gfx90c)", "RDNA1-RDNA4", "CPU build instead", "Linux with ROCm",
                  "WSL2", "--torch rocm"):
        assert words in text, (words, text)
    # an AMD adapter whose architecture is unknown: the same fallback, and how to name the card
    unknown = inst.Machine(os="windows", gpus=(inst.Gpu("amd", "AMD Radeon(TM) Graphics"),))
    p = inst.plan(unknown, inst.Options())
    assert p.build == "cpu" and "could not tell" in " ".join(p.messages) and "--gfx" in " ".join(p.messages)
    # ... named with --gfx: TheRock's wheels for that card
    p = inst.plan(unknown, inst.Options(gfx="gfx1201"))
    assert p.torch_install == pip("torch[device-gfx1201]==2.13.0", THEROCK)


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
    p = inst.plan(machine("linux", "ada-driver-13.0", torch="2.13.0+cpu"), inst.Options())
    assert p.torch_install is None and "NVIDIA GeForce RTX 4090" in p.messages[1] and "uninstall" in p.messages[1]
    assert len(inst.plan(machine("linux", "ada-driver-13.0", torch="2.9.1+cu128"), inst.Options()).messages) == 1


def test_torch_build_names():
    assert [inst.torch_build(v) for v in ("2.13.0+cpu", "2.9.1+cu128", "2.8.0+rocm6.4", "2.7.0a0+rocmsdk20250608",
                                          "2.13.0", "2.13.0+cpu.cxx11.abi")] == [
        "cpu", "cuda", "rocm", "rocm", "unknown", "cpu"]


def test_the_torch_option_overrides_detection():
    o = inst.Options
    assert inst.plan(machine("linux", "ada-driver-13.0"), o(torch="cpu")).torch_install == CPU_ARGS
    assert inst.plan(machine("linux", "none"), o(torch="cuda")).torch_install == CU130_ARGS      # PyTorch's default
    assert inst.plan(machine("windows", "none"), o(torch="cuda", cuda="cu126")).index_url == CU126
    assert inst.plan(machine("linux", "ada-driver-12.4"), o(torch="cuda")).torch_install == CU126_ARGS
    p = inst.plan(machine("linux", "ada-driver-11.8"), o(torch="cuda"))              # asked for: with a warning
    assert p.torch_install == CU130_ARGS and "525.60.13" in " ".join(p.messages)
    assert inst.plan(machine("linux", "ada-driver-13.0"), o(torch="rocm", rocm="rocm7.1")).index_url.endswith(
        "/rocm7.1")
    assert inst.plan(machine("linux", "rdna3"), o(torch_version="2.12.0")).torch_install[1] == "torch==2.12.0"
    # Windows: --torch rocm takes a card TheRock does not list too (with a warning), asks which card when none known
    p = inst.plan(machine("windows", "mi300"), o(torch="rocm"))
    assert p.torch_install == pip("torch[device-gfx942]==2.13.0", THEROCK) and "warning" in " ".join(p.messages)
    p = inst.plan(machine("windows", "none"), o(torch="rocm"))
    assert p.torch_install is None and "--gfx" in p.error
    p = inst.plan(machine("windows", "rdna3"), o(torch="rocm", rocm_windows_index="https://example.org/idx/"))
    assert p.index_url == "https://example.org/idx/"
    # keep without a torch, CUDA/ROCm on macOS: refused with a reason
    assert "--torch keep" in inst.plan(machine(), o(torch="keep")).error
    mac = inst.Machine(os="darwin", arch="arm64")
    assert "macOS" in inst.plan(mac, o(torch="cuda")).error
    assert inst.plan(mac, o()).torch_install == ["install", "torch==2.13.0"]            # PyPI's (MPS) build
    assert inst.plan(mac, o(torch="cpu")).torch_install == ["install", "torch==2.13.0"]


def test_offline_the_cpu_build_comes_from_pips_own_indexes():
    p = inst.plan(machine(online=False), inst.Options(torch_version="2.12.1"))
    assert p.torch_install == ["install", "torch==2.12.1+cpu"]          # as scripts/install.sh did offline
    assert "does not resolve" in p.messages[-1]
    p = inst.plan(machine("linux", "ada-driver-13.0", online=False), inst.Options())
    assert p.index_url == CU130 and "warning" in p.messages[-1]


def test_both_vendors_prefer_nvidia_and_say_so():
    m = inst.Machine(os="linux", gpus=(inst.Gpu("amd", "", "gfx1036"), NVIDIA), cuda_driver=(13, 0))
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
        "torch[device-gfx1100]==2.13.0"
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
        if cmd[-1] == "import sys; print(sys.prefix)":
            return f"{prefix}\n"
        return None

    def execute(cmd):
        ran.append(cmd[1:])
        return 0

    argv = ["--python", "fake-python", "--dev"]
    m = inst.Machine(os="linux", gpus=(NVIDIA,), cuda_driver=(13, 0))
    assert inst.main(argv, machine=m, run=run, execute=execute) == 0
    assert [c[:3] for c in ran] == [["-m", "pip", "install"], ["-m", "pip", "install"], ["-c", inst.GUARD]]
    assert ran[0][3:] == ["torch==2.13.0", "--index-url", CU130] and ran[1][3:] == ["-e", ".[dev]"]
    assert (prefix / ".steadyframe-install-dev").read_text().strip() == inst.stamp_value()

    ran.clear()
    assert inst.main(argv, machine=inst.Machine(os="linux", torch="2.9.1+cu128"), run=run, execute=execute) == 0
    assert ran == [] and "nothing to do" in capsys.readouterr().out

    ran.clear()
    assert inst.main(argv + ["--dry-run"], machine=m, run=run, execute=execute) == 0
    out = capsys.readouterr().out
    assert ran == [] and "fake-python -m pip install torch==2.13.0 --index-url " + CU130 in out

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


def test_nvidia_smi_says_the_family_and_the_drivers_cuda_version():
    """`nvidia-smi --query-gpu=name,compute_cap` names the family, the plain `nvidia-smi` header the driver's CUDA
    version; together they pick the row (a Blackwell card on a 570 driver: the CPU build and the driver needed)."""
    header = ("+-----------------------------------------------------------------------------------------+\n"
              "| NVIDIA-SMI 570.124.04   Driver Version: 570.124.04     CUDA Version: 12.8     |\n")

    def run(cmd, timeout=20):
        if Path(cmd[0]).name != "nvidia-smi":
            return None
        if cmd[1:2] == ["--query-gpu=name,compute_cap"]:
            return "NVIDIA GeForce RTX 5090, 12.0\nNVIDIA GeForce RTX 3090, 8.6\n"
        return header if len(cmd) == 1 else None
    gpus = inst.nvidia_gpus(run, proc=None)
    assert [(g.name, g.cc) for g in gpus] == [("NVIDIA GeForce RTX 5090", (12, 0)), ("NVIDIA GeForce RTX 3090", (8, 6))]
    assert inst.nvidia_driver(run) == ((12, 8), "570.124.04")
    assert inst.nvidia_driver(fake_tools({})) == (None, None)
    p = inst.plan(inst.Machine(os="linux", gpus=tuple(gpus), cuda_driver=(12, 8), driver="570.124.04"),
                  inst.Options())
    assert p.torch_install == CPU_ARGS and "580.65.06 or newer" in p.messages[0]
