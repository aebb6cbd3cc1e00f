"""ui/: the Gradio app's helpers (app.py wires them). Small modules, one job each, no import-time side effects.

    cli.py          command line, launch options, security warnings
    settings.py     the generation controls <-> pipeline Request / job.json settings
    layout.py       the Blocks layout (components only, no handlers)
    runner.py       the job runner: one GPU job at a time, per-session cancel tokens, a worker thread
    models.py       the per-(preset, mode) component cache
    view.py         pipeline events -> values of the UI components (preview, progress bar, log, status)
    hints.py        live explanations next to the controls (sections, invalid combinations, preserved memory)
    plots.py        memory timeline plot (PNG) and per-stage timings table
    jobs_gallery.py past jobs from outputs/ (job.json) for the gallery, "reuse settings" and "resume"
    api.py          the API for scripts (gradio_client): /video, /resume, /stop (its docstring is the README text)
    tempfiles.py    deletes Gradio's temporary copies of uploads and shown videos after --temp-max-age
"""
