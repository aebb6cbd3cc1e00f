"""The page: components and their arrangement, no handlers (app.py wires those). Call inside `gr.Blocks()`."""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from configs.controls import CONTROLS as TABLE
from configs.controls import Control
from ui import panel_keyframes, panel_lora, panel_saved
from ui import settings as st
from ui.view import progress_html
from ui.widgets import Widgets

CSS = """
.sf-progress {font-size: 0.95em; padding: 4px 2px;}
.sf-progress-track {height: 10px; background: var(--neutral-200); border-radius: 5px; overflow: hidden;
                    margin: 6px 0 2px 0;}
.sf-progress-fill {height: 100%; background: var(--color-accent); transition: width 0.2s;}
.sf-progress-detail {color: var(--body-text-color-subdued); font-size: 0.9em; min-height: 1.2em;}
.sf-progress-note {font-size: 0.85em; font-style: italic;}
#preview img {image-rendering: pixelated; object-fit: contain;}
#status {min-height: 1.5em;}
/* contrast (WCAG AA, 4.5:1 on white): the help under the labels, the sliders' ends, the muted lines, Start and
   End; and a focus ring that shows where the keyboard is (issue 44 item 7) */
body:not(.dark) .gradio-container {--block-info-text-color: #52525b; --body-text-color-subdued: #52525b;
    --button-primary-background-fill: #c2410c; --button-primary-background-fill-hover: #9a3412;
    --button-cancel-background-fill: #b91c1c; --button-cancel-background-fill-hover: #991b1b;}
body:not(.dark) .info-text, body:not(.dark) .min_value, body:not(.dark) .max_value, body:not(.dark) .or
    {color: #52525b !important;}
body:not(.dark) button.primary {background: #c2410c !important; color: #fff !important;}
body:not(.dark) button.stop {background: #b91c1c !important; color: #fff !important;}
.gradio-container button:focus-visible, .gradio-container input:focus-visible, .gradio-container textarea:focus-visible,
.gradio-container select:focus-visible, button:focus-visible
    {outline: none !important; box-shadow: 0 0 0 2px #fff, 0 0 0 5px #1d4ed8 !important;}
#header h2 {margin: 0 0 2px 0;}
#header p {margin: 0; font-size: 0.9em;}
#prompt-tokens {font-size: 0.85em; color: var(--body-text-color-subdued); margin-top: -6px;}
.sf-tokens-over {color: var(--color-red-600, #c62828); font-weight: 600;}
#jobs-gallery .caption-label, #jobs-gallery figcaption {white-space: normal !important; overflow: visible !important;
    text-overflow: clip !important; font-size: 0.8em;}
/* phones: Start, End, the status and the progress stay in a bar at the bottom of the screen */
@media (max-width: 768px) {
  #actions {position: fixed; left: 0; right: 0; bottom: 0; z-index: 100; margin: 0 !important; padding: 6px 10px;
            background: var(--background-fill-primary); box-shadow: 0 -2px 10px rgba(0, 0, 0, 0.2);
            max-height: 40vh; overflow-y: auto;}
  #actions button {min-height: 34px !important; padding: 4px 8px !important;}
  #actions .sf-progress-note, #actions .sf-progress-detail {display: none;}    /* the bar: Start, End, one line */
  #actions #status {font-size: 0.85em; min-height: 0;}
  .gradio-container {padding-bottom: 200px !important;}
  #jobs-gallery .grid-container {grid-template-columns: repeat(2, minmax(0, 1fr)) !important;}
}
/* Past jobs: the caption under the picture, not over it, inside its button (which clipped it: issue 44 item 2) */
#jobs-gallery .caption-label {position: static !important; background: none !important; color: inherit !important;
    max-width: 100% !important; margin: 0 !important; padding: 2px 4px !important; transform: none !important;}
#jobs-gallery button.thumbnail-item {overflow: visible !important; height: auto !important; aspect-ratio: auto !important;
    display: flex !important; flex-direction: column !important; align-items: stretch !important;}
#jobs-gallery button.thumbnail-item img {height: 120px !important; width: 100% !important; object-fit: contain !important;}
#jobs-gallery .grid-container {grid-auto-rows: auto !important; height: auto !important;}
"""
PHONE_MAX_WIDTH = 768
IMAGE_HEIGHT = 160                                   # the start and end images: the job fits one desktop screen
SIZE_CONTROLS = ("resolution", "width", "height")     # Advanced's last controls: the memory plan follows them
# After Start: the last refusal's error pop-ups close (they covered the new job's preview); on a narrow screen the
# preview comes into view (the bar at the bottom keeps Start, End and progress).
SHOW_PREVIEW_JS = (f"() => {{ document.querySelectorAll('.toast-close').forEach(b => b.click()); "   # stale errors
                   f"if (window.innerWidth <= {PHONE_MAX_WIDTH}) "
                   "document.querySelector('#preview')?.scrollIntoView({behavior: 'smooth', block: 'start'}); }")


@dataclass
class Layout:
    """The page's components. The generation controls are in `widgets` (by name, in the table's order) and
    read as attributes too (`layout.seconds`)."""
    widgets: dict
    randomize: gr.Button
    preserved_info: gr.Markdown
    prompt_tokens: gr.HTML
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
    lora: panel_lora.LoraPicker | None = None
    extend: gr.Button | None = None             # Past jobs: extend the selected job (ui/source_job.py)
    post_job: gr.Button | None = None           # Past jobs: the selected job's video to "After the video" (panel_post)
    studio_import: gr.UploadButton | None = None    # Past jobs: a FramePack-Studio job's settings (pipeline/studio.py)
    studio_report: gr.Markdown | None = None        # what that import could not map
    delete: gr.Button | None = None                 # Past jobs: delete the selected job (asks first)
    delete_note: gr.Markdown | None = None          # the question, or what was deleted
    delete_confirm: gr.Button | None = None         # shown by Delete; removes the job folder
    delete_pending: gr.State | None = None          # the job id Delete asked about (Confirm deletes that one)
    extend_note: gr.Markdown | None = None          # which way an extension goes (ui/panel_controls.py)
    extend_group: gr.Accordion | None = None        # the video / finished job to extend (opened by Extend)
    jobs_filter: gr.Textbox | None = None           # Past jobs: words a job must contain (ui/panel_jobs.py)
    keyframe_rows: panel_keyframes.KeyframeRows | None = None    # image + time + strength rows (the keyframes box)
    saved: panel_saved.SavedPanel | None = None     # Saved settings: save, load, rename, delete, the page's default

    def controls(self) -> list:
        """The generation controls in the table's order (ui.settings.CONTROLS: the handlers' and the API's)."""
        return list(self.widgets.values())

    def __getattr__(self, name: str):
        widgets = self.__dict__.get("widgets") or {}
        if name in widgets:
            return widgets[name]
        raise AttributeError(name)


def build_layout(preset, device_text: str, preserved_text: str, notice: str | None = None, *,
                 preserved_max_gb: float | None = None, examples: list | None = None,
                 table: tuple[Control, ...] = TABLE, lora_dir=None) -> Layout:
    """`preserved_max_gb`: the preserved-memory slider's top (the cap, or the card's memory when smaller);
    `examples`: [image path, prompt] rows (ui/examples.py); `table`: the controls (configs/controls.py) — one
    the layout does not place goes at the end of its group (the main column or Advanced)."""
    lim = st.limits(table)
    lo, hi = lim["preserved_gb"]
    if preserved_max_gb is not None:
        hi = max(min(hi, preserved_max_gb), 0.5)
        lim["preserved_gb"] = (lo if lo < hi else 0.0, hi)     # a cap under the slider's usual bottom: 0 … cap
    d = st.default_values(preset.default_resolution, table)
    d["preserved_gb"] = min(d["preserved_gb"], lim["preserved_gb"][1])
    w = Widgets(table, d, lim)
    gr.Markdown(f"## SteadyFrame · image to video, one section at a time\nModels: **{preset.name}** "
                f"({preset.description}). Device: {device_text}.", elem_id="header")
    if notice:
        gr.Markdown(f"⚠ {notice}", elem_id="notice")
    # One screen for a job (1280×900): the images, the prompt, the length and mode, Start/End with the status and
    # progress on the left; the preview and the video on the right. The rest is in groups under them: extending a
    # video, the job's settings and LoRAs (left); Advanced, then the memory plan right under the resolution it
    # depends on, and the log (right).
    with gr.Row():
        with gr.Column(scale=5):
            with gr.Row():
                image = w.place("image", height=IMAGE_HEIGHT)
                w.place("end_image", height=IMAGE_HEIGHT)
            prompt = w.place("prompt", lines=2, placeholder="Describe the motion, e.g. " + st.EXAMPLE_PROMPTS[0])
            prompt_tokens = gr.HTML("", elem_id="prompt-tokens")
            with gr.Row(equal_height=True):       # side by side: the job's progress fits a laptop's 780 px
                w.place("seconds")
                w.place("mode")                   # with a video to extend it says which way (pipeline/extend.py)
            with gr.Column(elem_id="actions"):
                with gr.Row():
                    start = gr.Button("Start", variant="primary", elem_id="start-btn")
                    end = gr.Button("End", variant="stop", interactive=False, elem_id="end-btn")
                progress = gr.HTML(progress_html(None), elem_id="progress")
                status = gr.Markdown("", elem_id="status")
            hints = gr.Markdown("", elem_id="hints")
            extend_note = gr.Markdown("", elem_id="extend-note")   # which way an extension goes (ui/panel_controls.py)
            with gr.Accordion("Extend a video or a finished job", open=False, elem_id="extend-group") as extend_group:
                w.place("input_video")            # extending a video: the new part joins it (pipeline/extend.py)
                w.place("source_job")             # or a finished job (ui/source_job.py; Past jobs' Extend fills it)
                if "context_frames" in w.rows:    # how much of that video the new sections see
                    w.place("context_frames")
            keyframe_rows = panel_keyframes.place(w) if "keyframes" in w.rows else None
            saved = panel_saved.place()           # named settings (pipeline/saved_settings.py)
            with gr.Accordion("Seed, steps and output", open=True, elem_id="job-settings"):
                with gr.Row():
                    w.place("seed", scale=4)
                    randomize = gr.Button("Random seed", scale=1, elem_id="randomize-seed")
                if "new_seed" in w.rows:
                    w.place("new_seed")
                w.place("steps")
                w.place("gs")
                w.place("crf")
                w.place_rest(advanced=False, keep=("preserved_gb", "loras"))   # placed below (right; the LoRAs)
            picker = panel_lora.place(w, lora_dir) if "loras" in w.rows else None
            if examples:
                gr.Examples(examples=examples, inputs=[image, prompt], label="Examples: click one to load its image "
                            "and prompt", elem_id="examples", examples_per_page=6)
            gr.Examples(examples=[[p] for p in st.EXAMPLE_PROMPTS], inputs=[prompt], label="Example prompts")
        with gr.Column(scale=6):
            preview = gr.Image(label="Latent preview (updates every step)", interactive=False, format="png",
                               height=200, elem_id="preview")
            video = gr.Video(label="Video (refreshes after every section)", interactive=False, autoplay=True,
                             loop=True, height=420, elem_id="result-video")
            with gr.Accordion("Advanced", open=False, elem_id="advanced"):
                for name in ("negative_prompt", "cfg", "rescale", "latent_window", "sampler", "teacache", "magcache"):
                    w.place(name)
                w.place_rest(advanced=True, keep=SIZE_CONTROLS)
                for name in SIZE_CONTROLS:        # last: the memory plan is right under them
                    w.place(name)
            preserved_info = gr.Markdown(preserved_text, elem_id="preserved-info")    # the plan, then its slider
            w.place("preserved_gb")
            with gr.Accordion("Log", open=True, elem_id="log-panel"):
                log = gr.Textbox(label="Stage messages", lines=10, max_lines=10, autoscroll=True,
                                 interactive=False, elem_id="log")
    with gr.Accordion("Memory and timings of the last job", open=False, elem_id="memory-and-timings") as report:
        memory_plot = gr.Image(label="Memory timeline", show_label=False, interactive=False, format="png",
                               elem_id="memory-plot")
        timings = gr.Markdown("_Shown after a job._", elem_id="timings")
    with gr.Accordion("Past jobs", open=False, elem_id="past-jobs"):
        with gr.Row():
            with gr.Column(scale=3):
                jobs_filter = gr.Textbox(label="Filter", placeholder="words of the prompt, the seed, the status or "
                                         "the id", max_length=200, elem_id="jobs-filter")
                gallery = gr.Gallery(label="Jobs in the outputs folder (newest first)", columns=4, height=360,
                                     allow_preview=False, elem_id="jobs-gallery")
                refresh = gr.Button("Refresh", size="sm", elem_id="jobs-refresh")
            with gr.Column(scale=2):
                job_video = gr.Video(label="Selected job", interactive=False, height=240, elem_id="job-video")
                with gr.Row():
                    reuse = gr.Button("Reuse settings", interactive=False, elem_id="reuse-btn")
                    resume = gr.Button("Resume", interactive=False, elem_id="resume-btn")
                    extend = gr.Button("Extend", interactive=False, elem_id="extend-btn")
                    post_job = gr.Button("After the video", interactive=False, elem_id="post-from-job-btn")
                    delete = gr.Button("Delete", variant="stop", size="sm", elem_id="delete-job-btn")
                delete_note = gr.Markdown("", elem_id="delete-job-note")
                delete_confirm = gr.Button("Confirm delete", variant="stop", size="sm", visible=False,
                                           elem_id="delete-job-confirm")
                gr.Markdown("_Resume continues a stopped or interrupted job from its last finished section._",
                            elem_id="resume-info")
                studio_import = gr.UploadButton("Import Studio settings", file_types=[".json", ".png"], size="sm",
                                                elem_id="studio-import")
                studio_report = gr.Markdown("_FramePack-Studio's metadata .json, or the .png it saves with a job: "
                                            "fills the controls as Reuse settings does._", elem_id="studio-report")
                job_details = gr.JSON(label="job.json", elem_id="job-details")
    return Layout(widgets=w.in_order(), randomize=randomize, preserved_info=preserved_info,
                  prompt_tokens=prompt_tokens, hints=hints, start=start, end=end, status=status, progress=progress,
                  preview=preview, video=video, log=log, report=report, memory_plot=memory_plot, timings=timings,
                  gallery=gallery, refresh=refresh, job_details=job_details, job_video=job_video, reuse=reuse,
                  resume=resume, jobs_state=gr.State([]), selected_job=gr.State(None), lora=picker,
                  extend=extend, post_job=post_job, studio_import=studio_import, studio_report=studio_report, delete=delete,
                  delete_note=delete_note, delete_confirm=delete_confirm, delete_pending=gr.State(None),
                  extend_note=extend_note, extend_group=extend_group, jobs_filter=jobs_filter,
                  keyframe_rows=keyframe_rows, saved=saved)
