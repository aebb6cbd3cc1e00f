"""The page: components and their arrangement, no handlers (app.py wires those). Call inside `gr.Blocks()`."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from configs import DEFAULTS
from configs.generation import MODES, SAMPLERS, TEACACHE_CHOICES
from ui import settings as st
from ui.view import progress_html

CSS = """
.sf-progress {font-size: 0.95em; padding: 4px 2px;}
.sf-progress-track {height: 10px; background: var(--neutral-200); border-radius: 5px; overflow: hidden;
                    margin: 6px 0 2px 0;}
.sf-progress-fill {height: 100%; background: var(--color-accent); transition: width 0.2s;}
.sf-progress-detail {color: var(--body-text-color-subdued); font-size: 0.9em; min-height: 1.2em;}
.sf-progress-note {font-size: 0.85em; font-style: italic;}
#preview img {image-rendering: pixelated; object-fit: contain;}
#status {min-height: 1.5em;}
#prompt-tokens {font-size: 0.85em; color: var(--body-text-color-subdued); margin-top: -6px;}
.sf-tokens-over {color: var(--color-red-600, #c62828); font-weight: 600;}
#jobs-gallery .caption-label, #jobs-gallery figcaption {white-space: normal !important; overflow: visible !important;
    text-overflow: clip !important; font-size: 0.8em;}
/* phones: Start, End, the status and the progress stay in a bar at the bottom of the screen */
@media (max-width: 768px) {
  #actions {position: fixed; left: 0; right: 0; bottom: 0; z-index: 100; margin: 0 !important; padding: 6px 10px;
            background: var(--background-fill-primary); box-shadow: 0 -2px 10px rgba(0, 0, 0, 0.2);
            max-height: 40vh; overflow-y: auto;}
  .gradio-container {padding-bottom: 200px !important;}
}
"""
PHONE_MAX_WIDTH = 768
# After Start on a narrow screen: bring the preview into view (the bar at the bottom keeps Start, End and progress).
SHOW_PREVIEW_JS = (f"() => {{ if (window.innerWidth <= {PHONE_MAX_WIDTH}) "
                   "document.querySelector('#preview')?.scrollIntoView({behavior: 'smooth', block: 'start'}); }")

MODE_LABELS = {"original": "Original (inverted anti-drifting; supports an end frame)",
               "f1": "F1 (forward; no end frame)"}
MODE_CHOICES = [(MODE_LABELS.get(m, m), m) for m in MODES]
TEACACHE_LABELS = {0.0: "off"}


@dataclass
class Layout:
    image: gr.Image
    end_image: gr.Image
    prompt: gr.Textbox
    negative_prompt: gr.Textbox
    seed: gr.Number
    randomize: gr.Button
    seconds: gr.Slider
    mode: gr.Radio
    steps: gr.Slider
    gs: gr.Slider
    cfg: gr.Slider
    rescale: gr.Slider
    latent_window: gr.Slider
    sampler: gr.Dropdown
    resolution: gr.Slider
    teacache: gr.Dropdown
    preserved_gb: gr.Slider
    preserved_info: gr.Markdown
    prompt_tokens: gr.HTML
    crf: gr.Slider
    hints: gr.Markdown
    start: gr.Button
    end: gr.Button
    status: gr.Markdown
    progress: gr.HTML
    preview: gr.Image
    video: gr.Video
    log: gr.Textbox
    report: gr.Accordion
    memory_plot: gr.Image
    timings: gr.Markdown
    gallery: gr.Gallery
    refresh: gr.Button
    job_details: gr.JSON
    job_video: gr.Video
    reuse: gr.Button
    resume: gr.Button
    jobs_state: gr.State
    selected_job: gr.State

    def controls(self) -> list:
        """The generation controls in ui.settings.CONTROLS order."""
        return [getattr(self, name) for name in st.CONTROLS]


def build_layout(preset, device_text: str, preserved_text: str, notice: str | None = None, *,
                 preserved_max_gb: float | None = None, examples: list | None = None) -> Layout:
    """`preserved_max_gb`: the preserved-memory slider's top (the cap, or the card's memory when smaller);
    `examples`: [image path, prompt] rows (ui/examples.py)."""
    lim = st.limits()
    lo, hi = lim["preserved_gb"]
    if preserved_max_gb is not None:
        hi = max(min(hi, preserved_max_gb), 0.5)
        lim["preserved_gb"] = (min(lo, hi), hi)
    d = st.default_values(preset.default_resolution)
    gr.Markdown(f"# SteadyFrame\nImage to video, one section at a time. Models: **{preset.name}** "
                f"({preset.description}). Device: {device_text}.")
    if notice:
        gr.Markdown(f"⚠ {notice}", elem_id="notice")
    with gr.Row():
        with gr.Column(scale=5):
            with gr.Row():
                image = gr.Image(label="Start image", type="filepath", image_mode=None, sources=["upload",
                                 "clipboard"], height=300, elem_id="start-image")
                end_image = gr.Image(label="End image (optional, original mode only)", type="filepath",
                                     image_mode=None, sources=["upload", "clipboard"], height=300,
                                     elem_id="end-image")
            prompt = gr.Textbox(label="Prompt", lines=2, value=d["prompt"], elem_id="prompt",
                                placeholder="Describe the motion, e.g. " + st.EXAMPLE_PROMPTS[0])
            prompt_tokens = gr.HTML("", elem_id="prompt-tokens")
            with gr.Column(elem_id="actions"):
                with gr.Row():
                    start = gr.Button("Start", variant="primary", elem_id="start-btn")
                    end = gr.Button("End", variant="stop", interactive=False, elem_id="end-btn")
                status = gr.Markdown("", elem_id="status")
                progress = gr.HTML(progress_html(None), elem_id="progress")
            hints = gr.Markdown("", elem_id="hints")
            if examples:
                gr.Examples(examples=examples, inputs=[image, prompt], label="Examples: click one to load its image "
                            "and prompt", elem_id="examples", examples_per_page=6)
            gr.Examples(examples=[[p] for p in st.EXAMPLE_PROMPTS], inputs=[prompt], label="Example prompts")
            seconds = gr.Slider(*lim["seconds"], value=d["seconds"], step=0.1, label="Total video length (seconds)",
                                elem_id="seconds")
            mode = gr.Radio(MODE_CHOICES, value=d["mode"], label="Mode", elem_id="mode")
            with gr.Row():
                seed = gr.Number(value=d["seed"], precision=0, label="Seed", minimum=lim["seed"][0],
                                 maximum=lim["seed"][1], elem_id="seed", scale=4)
                randomize = gr.Button("Random seed", scale=1, elem_id="randomize-seed")
            steps = gr.Slider(*lim["steps"], value=d["steps"], step=1, label="Steps", elem_id="steps",
                              info="Changing this is not recommended.")
            gs = gr.Slider(*lim["gs"], value=d["gs"], step=0.01, label="Distilled CFG scale", elem_id="gs")
            preserved_gb = gr.Slider(*lim["preserved_gb"], value=min(d["preserved_gb"], lim["preserved_gb"][1]),
                                     step=0.1,
                                     label="GPU inference preserved memory (GB)", elem_id="preserved-gb",
                                     info="Part of the VRAM cap kept free of resident transformer weights (at "
                                          "most the cap). "
                                          "Larger = fewer weights resident, more streamed per step = slower; "
                                          "raise it if you run out of memory.")
            preserved_info = gr.Markdown(preserved_text, elem_id="preserved-info")
            crf = gr.Slider(*lim["crf"], value=d["crf"], step=1, label="MP4 compression (CRF)", elem_id="crf",
                            info="Lower = better quality, bigger files. 0 = lossless (browsers may not play it).")
            with gr.Accordion("Advanced", open=False):
                negative_prompt = gr.Textbox(label="Negative prompt (used only when CFG > 1)",
                                             value=d["negative_prompt"], elem_id="negative-prompt")
                cfg = gr.Slider(*lim["cfg"], value=d["cfg"], step=0.01, label="CFG scale (real guidance)",
                                elem_id="cfg", info="1 = off (the distilled model needs none); > 1 doubles the cost.")
                rescale = gr.Slider(*lim["rescale"], value=d["rescale"], step=0.01, label="CFG rescale",
                                    elem_id="rescale")
                latent_window = gr.Slider(*lim["latent_window"], value=d["latent_window"], step=1,
                                          label="Latent window size", elem_id="latent-window",
                                          info=f"Latent frames per section ({DEFAULTS.latent_window} = 33 video "
                                               "frames); changing it is not recommended.")
                sampler = gr.Dropdown(list(SAMPLERS), value=d["sampler"], label="Sampler", elem_id="sampler")
                resolution = gr.Slider(*lim["resolution"], value=d["resolution"], step=16,
                                       label="Resolution (bucket base, multiple of 16)", elem_id="resolution")
                teacache = gr.Dropdown([(TEACACHE_LABELS.get(t, f"{t:g}"), t) for t in TEACACHE_CHOICES],
                                       value=d["teacache"], label="TeaCache threshold", elem_id="teacache",
                                       info="Skips transformer steps that change little: faster, slightly lossy.")
        with gr.Column(scale=6):
            preview = gr.Image(label="Latent preview (updates every step)", interactive=False, format="png",
                               height=200, elem_id="preview")
            video = gr.Video(label="Video (refreshes after every section)", interactive=False, autoplay=True,
                             loop=True, height=420, elem_id="result-video")
            with gr.Accordion("Log", open=True):
                log = gr.Textbox(label="Stage messages", lines=10, max_lines=10, autoscroll=True,
                                 interactive=False, elem_id="log")
    with gr.Accordion("Memory and timings of the last job", open=False, elem_id="memory-and-timings") as report:
        memory_plot = gr.Image(label="Memory timeline", show_label=False, interactive=False, format="png",
                               elem_id="memory-plot")
        timings = gr.Markdown("_Shown after a job._", elem_id="timings")
    with gr.Accordion("Past jobs", open=False, elem_id="past-jobs"):
        with gr.Row():
            with gr.Column(scale=3):
                gallery = gr.Gallery(label="Jobs in the outputs folder (newest first)", columns=4, height=360,
                                     allow_preview=False, elem_id="jobs-gallery")
                refresh = gr.Button("Refresh", size="sm", elem_id="jobs-refresh")
            with gr.Column(scale=2):
                job_video = gr.Video(label="Selected job", interactive=False, height=240, elem_id="job-video")
                with gr.Row():
                    reuse = gr.Button("Reuse settings", interactive=False, elem_id="reuse-btn")
                    resume = gr.Button("Resume", interactive=False, elem_id="resume-btn")
                gr.Markdown("_Resume continues a stopped or interrupted job from its last finished section._",
                            elem_id="resume-info")
                job_details = gr.JSON(label="job.json", elem_id="job-details")
    return Layout(image=image, end_image=end_image, prompt=prompt, negative_prompt=negative_prompt, seed=seed,
                  randomize=randomize, seconds=seconds, mode=mode, steps=steps, gs=gs, cfg=cfg, rescale=rescale,
                  latent_window=latent_window, sampler=sampler, resolution=resolution, teacache=teacache,
                  preserved_gb=preserved_gb, preserved_info=preserved_info, prompt_tokens=prompt_tokens, crf=crf, hints=hints, start=start,
                  end=end, status=status, progress=progress, preview=preview, video=video, log=log,
                  report=report, memory_plot=memory_plot, timings=timings, gallery=gallery, refresh=refresh,
                  job_details=job_details, job_video=job_video, reuse=reuse, resume=resume, jobs_state=gr.State([]),
                  selected_job=gr.State(None))
