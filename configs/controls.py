"""The generation controls, each declared once.

One row per setting of a job: its name, type, default, limits, help, how the page shows it, its command-line
option. Everything else is derived from this table:

- `configs.generation.DEFAULTS` / `LIMITS` (the numbers below, by name),
- `pipeline.request.Request` (one field per row), its checks (`pipeline.request.check_settings`) and
  `Request.from_mapping` (job.json, resume, batch lines, the CLI's values),
- the command line's options (`cli.commands.add_settings`),
- the page's controls and the `/video` API's parameters (`ui/`),
- the README's table of controls (`python -m configs.readme --write README.md`; tests/test_controls.py fails
  when it is out of date).

Adding a setting = adding a row here (and using it in the pipeline). Data only: nothing here imports the rest.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from configs.memory import MEMORY

MODES = ("original", "f1")
SAMPLERS = ("unipc", "unipc_bh2", "euler")   # pipeline/samplers.py; unipc = FramePack's (bh1)
TEACACHE_CHOICES = (0.0, 0.1, 0.15, 0.2)
MAGCACHE_CHOICES = (0.0, 0.05, 0.1, 0.15)   # pipeline/magcache.py; 0.1 = its authors' default
# Text-to-video (pipeline/text_to_video.py): what the video starts from when no start image is given.
STARTS = ("image", "noise", "black", "white", "green")
COMPILE_CHOICES = ("on", "off")
ON_OFF = ("off", "on")                   # a switch: "on" does it
CONTEXT_FRAMES_MAX = 19                  # FramePack's clean history: 1 + 2 + 16 latents (pipeline/sections.py)
KINDS = ("image", "video", "text", "int", "float", "choice")
FILE_KINDS = ("image", "video")          # a file (path or upload): not a setting of job.json
WIDGETS = ("image", "video", "textbox", "number", "slider", "radio", "dropdown")


@dataclass(frozen=True)
class Control:
    """One generation setting. `name` is the Request field and the name everywhere a program passes it: the
    `/video` API parameter, the key in job.json's "settings" and in batch lines."""
    name: str
    kind: str                               # one of KINDS
    default: Any = None                     # None for a number: `preset_default` or "not set"
    limits: tuple | None = None             # (lowest, highest), inclusive; checked for every way in
    choices: tuple = ()                     # kind "choice": the allowed values; a number: the values the page offers
    choice_labels: tuple = ()               # ((value, text), ...) where the page shows a value by another text
    multiple_of: int | None = None
    label: str = ""                         # what the page calls it (its messages name the field so)
    field: str = ""                         # what the pipeline's messages call it; default: name with spaces
    help: str = ""                          # one line: --help, the API's docstring, the README
    widget: str | None = None               # one of WIDGETS; None: neither on the page nor in the /video API
    widget_label: str = ""                  # the label on the page when it says more than `label`
    info: str = ""                          # the note under the widget
    step: float | None = None               # slider step
    ui_limits: tuple | None = None          # the widget's range when narrower than `limits`
    advanced: bool = False                  # under the page's "Advanced"
    cli: str | None = ""                    # the option; "": --name-with-dashes; None: no option
    cli_aliases: tuple = ()                 # older spellings, still accepted
    required: bool = False
    required_unless: str = ""               # required unless this other control is given (image unless video)
    preset_default: bool = False            # default None = the model preset's `default_<name>`
    elem_id: str = ""                       # the page element's id; default: name with dashes
    default_text: str = ""                  # the default as the README says it, when not the value itself
    repeat: bool = False                    # the option may be given several times (its values joined by ", ")

    @property
    def option(self) -> str | None:
        """The command line's option, e.g. "--latent-window"; None when the command line has none."""
        if self.cli is None:
            return None
        return self.cli or "--" + self.name.replace("_", "-")

    @property
    def field_name(self) -> str:
        return self.field or self.name.replace("_", " ")

    @property
    def api_name(self) -> str | None:
        """The /video API's parameter (the page's controls are the API's inputs)."""
        return self.name if self.widget else None

    @property
    def element_id(self) -> str:
        return self.elem_id or self.name.replace("_", "-")

    @property
    def keys(self) -> tuple[str, ...]:
        """Names a mapping may use for it: the name and the old option spellings ("window" for latent_window)."""
        return (self.name,) + tuple(a.lstrip("-").replace("-", "_") for a in self.cli_aliases)

    @property
    def is_file(self) -> bool:
        return self.kind in FILE_KINDS

    @property
    def is_number(self) -> bool:
        return self.kind in ("int", "float")

    def widget_range(self) -> tuple | None:
        return self.ui_limits or self.limits


CONTROLS: tuple[Control, ...] = (
    # The order is the /video API's (and the page handlers') order of parameters.
    # Not needed for text-to-video (the `start_from` control other than "image": pipeline/request.py).
    Control("image", "image", required=True, required_unless="input_video", label="Start image", widget="image",
            elem_id="start-image",
            help="the start image (PNG, JPEG, WebP ...); none for text-to-video (--start-from noise)"),
    Control("end_image", "image", label="End image", widget="image", help="optional end frame (original mode only)",
            widget_label="End image (optional, original mode only)"),
    Control("prompt", "text", "", label="Prompt", widget="textbox",
            info="Changes over time with [time: text] blocks: [0s: a cat sits] [2s: the cat jumps]",
            help="what should happen; timed: [0s: a cat sits] [2s: the cat jumps]; longer than 4000 characters "
                 "is cut (a warning says so)"),
    Control("negative_prompt", "text", "", label="Negative prompt", widget="textbox", advanced=True,
            widget_label="Negative prompt (used only when CFG > 1)", help="used only when CFG > 1"),
    Control("seed", "int", 31337, (0, 2**63 - 1), label="Seed", widget="number",
            help="the random seed (same seed and settings = same video)"),
    Control("seconds", "float", 5.0, (1.0, 120.0), label="Total video length", widget="slider", step=0.1,
            widget_label="Total video length (seconds)", help="length of the video in seconds (whole sections)"),
    Control("mode", "choice", "original", choices=MODES, label="Mode", widget="radio",
            choice_labels=(("original", "Original (inverted anti-drifting; supports an end frame)"),
                           ("f1", "F1 (forward; no end frame)")),
            help="original (inverted anti-drifting; supports an end frame) or f1 (forward)"),
    Control("steps", "int", 25, (1, 100), label="Steps", widget="slider", step=1,
            info="Changing this is not recommended.", help="sampling steps per section"),
    Control("gs", "float", 10.0, (1.0, 32.0), label="Distilled CFG scale", field="distilled CFG (gs)",
            widget="slider", step=0.01, help="distilled CFG scale"),
    Control("cfg", "float", 1.0, (1.0, 32.0), label="CFG scale", field="CFG", widget="slider", step=0.01,
            advanced=True, widget_label="CFG scale (real guidance)",
            info="1 = off (the distilled model needs none); > 1 doubles the cost.",
            help="real CFG scale (1 = off); > 1 uses the negative prompt (twice the compute)"),
    Control("rescale", "float", 0.0, (0.0, 1.0), label="CFG rescale", field="CFG rescale", widget="slider",
            step=0.01, advanced=True, help="CFG rescale (only with CFG > 1)"),
    Control("latent_window", "int", 9, (1, 33), label="Latent window size", field="latent window",
            widget="slider", step=1, advanced=True, cli_aliases=("--window",),
            info="Latent frames per section (9 = 33 video frames); changing it is not recommended.",
            help="latent frames per section"),
    Control("sampler", "choice", "unipc", choices=SAMPLERS, label="Sampler", widget="dropdown", advanced=True,
            help="unipc (FramePack's), unipc_bh2 or euler (diffusers')"),
    Control("resolution", "int", None, (64, 2048), multiple_of=16, preset_default=True, label="Resolution",
            widget="slider", step=16, advanced=True,
            widget_label="Resolution (bucket target: 640, 720, 960 … a multiple of 16)",
            info="The start image is cropped to the bucket of this target nearest its aspect ratio (area ≈ "
                 "target²). Larger costs memory and time: see the memory plan.",
            default_text="the preset's (640; tiny 64)",
            help="bucket target resolution: 640 (FramePack's table), 720, 960 … any multiple of 16"),
    Control("width", "int", 0, (0, 2048), multiple_of=16, label="Custom width", field="custom width",
            widget="number", advanced=True, info="0 = the bucket. Give width and height (multiples of 16, at least "
            "64) to crop to exactly that size instead.",
            help="custom width in pixels, with the height (multiple of 16; 0 = the resolution's bucket)"),
    Control("height", "int", 0, (0, 2048), multiple_of=16, label="Custom height", field="custom height",
            widget="number", advanced=True, info="0 = the bucket; set together with the custom width.",
            help="custom height in pixels, with the width (multiple of 16; 0 = the resolution's bucket)"),
    Control("teacache", "float", 0.15, (0.0, 1.0), choices=TEACACHE_CHOICES, choice_labels=((0.0, "off"),),
            label="TeaCache threshold", field="TeaCache threshold", widget="dropdown", advanced=True,
            info="Skips transformer steps that change little: faster, slightly lossy.",
            help="TeaCache threshold (0 = off)"),
    Control("preserved_gb", "float", MEMORY.preserved_gb, (0.0, MEMORY.preserved_max_gb),
            ui_limits=(MEMORY.preserved_min_gb, MEMORY.preserved_max_gb), label="GPU inference preserved memory",
            field="preserved memory (GB)", widget="slider", step=0.1,
            widget_label="GPU inference preserved memory (GB)",
            info="Part of the VRAM cap kept free of resident transformer weights (at most the cap). Larger = fewer "
                 "weights resident, more streamed per step = slower; raise it if you run out of memory.",
            help="GPU memory kept free of resident transformer weights, GiB (larger = less VRAM, slower)"),
    Control("crf", "int", 16, (0, 51), label="MP4 compression (CRF)", widget="slider", step=1,
            info="Lower = better quality, bigger files. 0 = lossless (browsers may not play it).",
            help="MP4 compression (0 = lossless, 51 = smallest)"),
    Control("prompt_blend", "int", 0, (0, 16), label="Prompt blend (sections)", field="prompt blend",
            widget="slider", step=1, advanced=True,
            info="Timed prompts: sections over which one prompt blends into the next (0 = switch at once).",
            help="sections over which a timed prompt blends into the next (0 = switch at once)"),
    # Extending a video (pipeline/extend.py): its last frame is the start image, so no image is given with it.
    Control("input_video", "video", label="Video to extend", field="video", widget="video",
            cli_aliases=("--video", "--extend"), elem_id="extend-video",
            widget_label="Video to extend (optional; replaces the start image; F1: the new part follows it, "
                         "original: it goes before it, or with an end image after it)",
            help="a video (mp4, webm, mov) or a finished F1 job folder to extend; seconds = the length added. F1: the "
                 "new part continues after its last frame; original mode: the new part goes before it (the video "
                 "ends with the input), or, with an end image, after it and ends at the end image"),
    Control("source_job", "text", "", label="Job to extend", field="job to extend", widget="textbox", cli=None,
            elem_id="extend-job", widget_label="Job to extend (optional; a finished F1 job's id: pick it in the gallery "
            "and press Extend; its latents are reused)",
            help="the job_id of a finished F1 job in the app's outputs folder, continued from its saved latents "
                 "(page and API; instead of a video or a start image; F1 mode). The command line takes the job's "
                 "folder as --extend"),
    Control("loras", "text", "", label="LoRAs", widget="textbox", cli_aliases=("--lora",), repeat=True,
            widget_label="LoRAs (file:strength, comma-separated)",
            info="Pick from the LoRA folder below, or type names in it (or paths) with a strength from -2 to 2.",
            default_text="none",
            help="a LoRA and its strength, e.g. style.safetensors:0.8 (-2 to 2; repeat for several; a name is "
                 "looked up in --lora-dir)"),
    # The end image's share of the SigLIP image conditioning (see pipeline/orchestrator.py); Advanced on the page.
    Control("end_embed_weight", "float", 0.5, (0.0, 1.0), label="End-frame embedding weight",
            field="end-frame embedding weight", help="share of the end image in the image conditioning",
            widget="slider", step=0.05, advanced=True,
            widget_label="End-frame strength (original mode, with an end image)",
            info="How much the end image steers the video's look (0 = only the start image, 1 = only the end "
                 "image)."),
    # pipeline/compiled.py; the command line's switch is the process option --no-compile (configs/options.py).
    Control("compile", "choice", "on", choices=COMPILE_CHOICES, label="Compiled transformer", field="compile",
            widget="radio", advanced=True, cli=None,
            choice_labels=(("on", "on (GPU; the first job prepares kernels)"), ("off", "off (eager)")),
            info="On a GPU the transformer blocks run compiled (torch.compile): faster steps; the first job of a "
                 "size prepares kernels (kept for later starts). The CPU always runs them eagerly.",
            help="compiled transformer blocks on a GPU: on (default) or off (eager); the CPU always runs eagerly; "
                 "the command line's switch is --no-compile"),
    # pipeline/magcache.py; last in the table so that the /video API's positional order of the others stays.
    Control("magcache", "float", 0.0, (0.0, 1.0), choices=MAGCACHE_CHOICES, choice_labels=((0.0, "off"),),
            label="MagCache threshold", field="MagCache threshold", widget="dropdown", advanced=True,
            info="Skips transformer steps by their calibrated residual magnitudes (0.1 = its authors' default): "
                 "faster, slightly lossy. Only with TeaCache off.",
            help="MagCache threshold (0 = off; 0.1 = its authors' default); only with TeaCache off (--teacache 0)"),
    # Text-to-video (pipeline/text_to_video.py, FramePack-Studio's "Latent Image"): no start image; the video
    # starts from seeded noise or a plain colour, at the resolution control's square bucket (or the custom size).
    Control("start_from", "choice", "image", choices=STARTS, label="Start from", field="start from",
            widget="radio", cli_aliases=("--text-to-video",),
            choice_labels=(("image", "the start image"), ("noise", "noise (text-to-video)"),
                           ("black", "black (text-to-video)"), ("white", "white (text-to-video)"),
                           ("green", "green screen (text-to-video)")),
            info="Text-to-video: leave the start image empty and start from noise or a plain colour.",
            help="image (the start image, default) or text-to-video without one: noise (seeded), black, white or "
                 "green (a plain colour)"),
    # Video modes (issue 32).
    Control("keep_final_only", "choice", "off", choices=ON_OFF, label="Keep only the final video",
            field="keep only the final video", widget="radio", advanced=True,
            info="on: each section's mp4 is deleted once final.mp4 is written (a stopped job keeps them, for Resume).",
            help="on: delete the section videos once the job is done and final.mp4 is written (off keeps them)"),
    Control("new_seed", "choice", "off", choices=ON_OFF, label="New seed for each job", field="new seed",
            widget="radio",
            info="on: each job added (Start, queue, batch) gets a fresh random seed, recorded in its job.json.",
            help="on: each job gets a fresh random seed when it is queued (recorded in job.json; batch and queue "
                 "add)"),
    # Extending (pipeline/extend.py): FramePack's clean-latent context holds 19 latents (1x 1, 2x 2, 4x 16).
    Control("context_frames", "int", 0, (0, CONTEXT_FRAMES_MAX), label="Context frames", field="context frames",
            widget="slider", step=1, default_text="0 (automatic)",
            widget_label="Context frames (extending: the input video's latent frames that condition the new part)",
            info="0 = automatic: 19 (all FramePack's context holds) for F1 and backward, 5 toward an end frame (there "
                 "each is a full-size latent: more costs time and memory). Fewer = freer motion, more = closer to "
                 "the video.",
            help="extending: how many of the input video's latent frames (4 video frames each) condition the new "
                 "sections, 1 to 19; 0 = automatic (19; 5 toward an end frame, where each costs like a generated "
                 "frame)"),
    # The loop switch (video/loop.py): the original mode ends at the start image; the seam is blended in both modes.
    Control("loop", "choice", "off", choices=ON_OFF, label="Loop", field="loop", widget="radio",
            info="on: the video returns to its first frame (original mode: the start image is also the end frame; "
                 "the last frames are blended into the first) so it plays seamlessly on repeat.",
            help="on: a seamless loop: the last frame returns to the first (the original mode uses the start image "
                 "as the end frame; the seam is blended over a few frames)"),
    # The output frame rate (last rows: the /video API's positional order of the others stays).
    Control("fps", "int", 30, (1, 120), label="Frames per second", field="fps", widget="number", advanced=True,
            info="The output video's frame rate: the same frames play faster or slower, and the length in seconds "
                 "(and the times of timed prompts and keyframes) follows it.",
            help="frames per second of the output video (the frames are the same; seconds and timed prompts count "
                 "at this rate)"),
    # Keyframes (pipeline/keyframes.py): images at chosen times, original mode; the page builds it from its rows.
    Control("keyframes", "text", "", label="Keyframes", field="keyframes", cli_aliases=("--keyframe",),
            repeat=True, default_text="none", widget="textbox",
            widget_label="Keyframes ([time] image, written by the rows above; the API: uploaded files)",
            help="an image at a time of the video, original mode: TIME=FILE or TIME:STRENGTH=FILE (strength 0-1, "
                 "default 1), e.g. --keyframe 2.5=middle.png; repeat for several (job.json and batch lines: "
                 "\"[2.5s] middle.png [4s, 0.8] other.png\")"),
    # fp8 attention (rocm/fp8_attention.py, chosen in rocm/sdpa.py): FlashAttention-3's fp8 kernel where it is built,
    # else cuDNN's through the cuDNN frontend; refused before the job is queued where the GPU or the install lacks
    # both (jobs/preflight.py). Last row: the /video API's positional order of the others stays.
    Control("fp8_attention", "choice", "off", choices=ON_OFF, label="fp8 attention", field="fp8 attention",
            widget="radio", advanced=True,
            info="on: the transformer's attention runs in fp8 (NVIDIA Hopper or newer): through FlashAttention-3 "
                 "where it is built (scripts/build_flash_attention_3.sh; on an H200 with fp8 compute a step went "
                 "from 0.61x to 0.55x of eager), else through cuDNN (the nvidia-cudnn-frontend package; slower "
                 "than FlashAttention-4's bf16). Slightly less exact than bf16 (BENCHMARKS.md). Jobs that ask for "
                 "it elsewhere are refused.",
            help="on: the transformer's attention in fp8 through FlashAttention-3 where built "
                 "(scripts/build_flash_attention_3.sh), else NVIDIA's cuDNN frontend (Hopper or newer; pip install "
                 "nvidia-cudnn-frontend); off (default): bf16. Refused where the GPU or the install lacks "
                 "it"),
)


def control(name: str, controls: tuple[Control, ...] = CONTROLS) -> Control:
    for c in controls:
        if c.name == name:
            return c
    raise KeyError(name)
