"""ui/: the Gradio app's helpers (app.py wires them). Small modules, one job each, no import-time side effects.

    cli.py          command line, launch options, security warnings
    settings.py     the generation controls <-> pipeline Request / job.json settings
    layout.py       the Blocks layout (components only, no handlers) and the page's CSS
    context.py      what the handlers share (AppContext); the preserved-memory bound
    panel_controls.py  live hints, memory plan, token count, upload checks, random seed
    panel_run.py    Start, Resume, End and the running job (long-job confirmation, report after the job)
    panel_jobs.py   past jobs: gallery, details, Reuse settings, Delete
    runner.py       the job runner: one GPU job at a time in click order, places and waits, staged images
    messages.py     messages for the page: fields by their labels, no exception class names
    uploads.py      uploads checked when they arrive
    prompt_tokens.py  the live token count under the prompt
    examples.py     example images drawn in code, with prompts
    models.py       the per-(preset, mode) component cache
    view.py         pipeline events -> values of the UI components (preview, progress bar, log, status)
    hints.py        live explanations next to the controls (sections, invalid combinations, preserved memory)
    plots.py        memory timeline plot (PNG) and per-stage timings table
    jobs_gallery.py past jobs from outputs/ (job.json) for the gallery, "reuse settings" and "resume"
    api.py          the API for scripts (gradio_client): /video, /resume, /stop (its docstring is the README text)
    tempfiles.py    deletes Gradio's temporary copies of uploads and shown videos after --temp-max-age
"""
