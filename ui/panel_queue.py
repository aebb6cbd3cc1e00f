"""The Queue panel: the jobs waiting on disk (jobs/store.py) with their status and progress, and what can
be done to them: add the page's settings as a job, one job per uploaded image, import/export JSON lines, move a
waiting job up or down, remove it (End on a waiting job: at once), load its settings into the controls or save the
controls into it. `start_queue(ctx)` opens the store, starts the worker and registers the /queue_* API."""
from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import gradio as gr

from common.errors import InputError
from jobs import store as qs
from ui import messages
from ui import settings as st
from ui.context import AppContext
from ui.media import published
from ui.queue_api import QueueActions, QueueApi

log = logging.getLogger(__name__)

REFRESH_S = 2.0             # the list is read again this often while the page is open
SHOWN_TABS_MAX = 256        # the tabs whose shown list the panel remembers (the oldest forgotten: sent again)
HEADERS = ["#", "id", "status", "prompt", "note"]         # five: a phone shows them all (nine were cut off)
PROMPT_CHARS = 48
LABELS = {"queued job": "Queued job", "images": "Images (one job each)", "jobs file": "Import JSON lines"}


def rows(entries: list[qs.Entry]) -> list[list]:
    out = []
    for n, e in enumerate(entries, 1):
        prompt = " ".join(str(e.settings.get("prompt", "")).split())
        seconds = e.settings.get("seconds")
        note = [f"{e.progress * 100:.0f} %" if e.status == qs.RUNNING else "",
                f"{seconds:g} s" if isinstance(seconds, (int, float)) and not isinstance(seconds, bool) else "",
                e.message[:120]]
        out.append([n, e.id, e.status, prompt[:PROMPT_CHARS] + ("…" if len(prompt) > PROMPT_CHARS else ""),
                    " · ".join(t for t in note if t)])
    return out


@dataclass
class QueueParts:
    status: gr.Markdown
    table: gr.Dataframe
    pick: gr.Dropdown
    up: gr.Button
    down: gr.Button
    remove: gr.Button
    load: gr.Button
    save: gr.Button
    add: gr.Button
    images: gr.File
    add_images: gr.Button
    import_file: gr.File
    export: gr.Button
    export_file: gr.File
    timer: gr.Timer
    clear: gr.Button = None


def build_parts() -> QueueParts:
    with gr.Accordion("Queue", open=True, elem_id="queue"):
        gr.Markdown("_Queued jobs wait on disk and run one after another when the GPU is free; they survive a "
                    "restart (an interrupted one continues from its last finished section). Click a row to pick "
                    "its job._")
        status = gr.Markdown("", elem_id="queue-status")
        table = gr.Dataframe(headers=HEADERS, value=[], interactive=False, wrap=True, elem_id="queue-table")
        with gr.Row():
            pick = gr.Dropdown(label="Picked job (click its row in the list)", choices=[], value=None, interactive=True,
                               scale=3,
                               elem_id="queue-pick")
            up = gr.Button("Up", size="sm", elem_id="queue-up")
            down = gr.Button("Down", size="sm", elem_id="queue-down")
            remove = gr.Button("Remove / End", size="sm", variant="stop", elem_id="queue-remove")
            load = gr.Button("Load its settings", size="sm", elem_id="queue-load")
            save = gr.Button("Save the settings above into it (its images stay)", size="sm", elem_id="queue-save")
            clear = gr.Button("Clear finished", size="sm", elem_id="queue-clear")
        with gr.Row():
            add = gr.Button("Add to queue", variant="primary", elem_id="queue-add")
            images = gr.File(label=LABELS["images"], file_count="multiple", file_types=["image"],
                             elem_id="queue-images")
            add_images = gr.Button("Add one job per image", elem_id="queue-add-images")
        with gr.Row():
            import_file = gr.File(label=LABELS["jobs file"], file_types=[".jsonl", ".json", ".txt"],
                                  elem_id="queue-import")
            export = gr.Button("Export the waiting jobs", elem_id="queue-export-btn")
            export_file = gr.File(label="Exported queue (JSON lines)", interactive=False, elem_id="queue-export")
        timer = gr.Timer(REFRESH_S)
    return QueueParts(status, table, pick, up, down, remove, load, save, add, images, add_images, import_file,
                      export, export_file, timer, clear)


def _tab(request) -> str:
    """The tab a handler answers ('' for a call without one: nothing is remembered for it)."""
    return str(getattr(request, "session_hash", None) or "")


class QueuePanel:
    def __init__(self, ctx: AppContext, actions: QueueActions, parts: QueueParts, warning: str | None = None):
        self.ctx, self.actions, self.parts = ctx, actions, parts
        self.warning = warning
        self.recovered: dict[str, bool] = {}     # entry id -> interrupted, for the jobs the last run left queued
        self._shown: OrderedDict[str, tuple] = OrderedDict()    # tab -> the list and choices last sent to it
        self._shown_lock = threading.Lock()

    def recovered_text(self, user) -> str:
        """The jobs the app found in its queue at start (the last run's), while some of them are still to run."""
        ids = {e.id for e in self.actions.visible(user, [qs.WAITING, qs.RUNNING]) if e.id in self.recovered}
        if not ids:
            return ""
        broken = sum(self.recovered[i] for i in ids)
        return (f"ℹ {len(ids)} queued job{'s' if len(ids) != 1 else ''} from before the restart "
                f"{'run' if len(ids) != 1 else 'runs'} now, in order"
                + (f" ({broken} interrupted: {'they continue' if broken != 1 else 'it continues'} from the last "
                   f"finished section)" if broken else "") + ".")

    def _user(self, request) -> str | None:
        return self.ctx.access.user(request)

    def refresh(self, picked=None, request: gr.Request = None):
        entries = self.actions.visible(self._user(request))
        choices = [(f"{n}. {e.id} · {e.status} · {str(e.settings.get('prompt', ''))[:30]}", e.id)
                   for n, e in enumerate(entries, 1)]
        value = picked if any(picked == c[1] for c in choices) else None
        table = rows(entries)
        self._sent(request, (table, choices, value))
        return table, gr.update(choices=choices, value=value)

    def tick(self, picked=None, request: gr.Request = None):
        """The timer's refresh: nothing is sent to a tab that shows this list already (Gradio's page draws a data
        frame again whenever it is sent one, the same or not: every REFRESH_S in every open tab)."""
        session = _tab(request)
        with self._shown_lock:
            before = self._shown.get(session) if session else None
        shown = self.refresh(picked, request)
        with self._shown_lock:
            unchanged = before is not None and self._shown.get(session) == before
        return (gr.skip(), gr.skip()) if unchanged else shown

    def _sent(self, request, shown: tuple) -> None:
        session = _tab(request)
        if not session:
            return
        with self._shown_lock:
            self._shown[session] = shown
            self._shown.move_to_end(session)
            while len(self._shown) > SHOWN_TABS_MAX:
                self._shown.popitem(last=False)

    def _after(self, text: str, request, picked=None):
        return (text, *self.refresh(picked, request))

    @staticmethod
    def _refuse(error: InputError):
        field = LABELS.get(error.field) or messages.label(error.field)
        raise gr.Error(f"{field}: {messages.plain(error.message)}", title="Please check the input",
                       print_exception=False)

    def _do(self, action, done_text, request, picked=None):
        try:
            result = action()
        except InputError as e:
            self._refuse(e)
        text = done_text(result) if callable(done_text) else done_text
        return self._after(text, request, picked)

    # ---- handlers ---------------------------------------------------------------------------------------------------
    def on_load(self, picked=None, request: gr.Request = None):
        text = f"⚠ {self.warning}" if self.warning else ""
        text = "\n\n".join(t for t in (text, self.recovered_text(self._user(request))) if t)
        if self.ctx.public_notice:
            text = "\n\n".join(t for t in (text, f"⚠ {self.ctx.public_notice}") if t)
        return self._after(text, request, picked)

    def add(self, request: gr.Request, *values):
        user, client = self._user(request), self.actions.access.client(request)
        return self._do(lambda: self.actions.add(dict(zip(st.CONTROLS, values)), user, client),
                        lambda e: f"Added job {e.id} to the queue.", request)

    def add_images(self, request: gr.Request, images, *values):
        user, client = self._user(request), self.actions.access.client(request)

        def add():
            return self.actions.add_images(images, {**dict(zip(st.CONTROLS, values)), "image": None}, user, client)

        return self._do(add, lambda added: f"Added {len(added)} job{'s' if len(added) != 1 else ''} (one per image).",
                        request)

    def import_jsonl(self, path, request: gr.Request):
        return self._do(lambda: self.actions.import_jsonl(path, self._user(request),
                                                          self.actions.access.client(request)),
                        lambda added: f"Imported {len(added)} job{'s' if len(added) != 1 else ''}.", request)

    def export(self, request: gr.Request):
        return self.actions.export_path(self._user(request))

    def step(self, picked, by: int, request):
        return self._do(lambda: self.actions.step(picked, by, self._user(request)), "Moved.", request, picked)

    def up(self, picked, request: gr.Request):
        return self.step(picked, -1, request)

    def down(self, picked, request: gr.Request):
        return self.step(picked, +1, request)

    def clear_finished(self, request: gr.Request):
        gone = self.actions.clear_finished(self._user(request))
        return self._after(f"Cleared {gone} finished job{'s' if gone != 1 else ''} from the list (their videos stay "
                           f"in Past jobs)." if gone else "No finished jobs to clear.", request)

    def remove(self, picked, request: gr.Request):
        return self._do(lambda: self.actions.remove(picked, self._user(request)), lambda text: text, request)

    def save(self, request: gr.Request, picked, *values):
        def edit():
            return self.actions.edit(picked, dict(zip(st.CONTROLS, values)), self._user(request), from_page=True)

        return self._do(edit, lambda e: f"Saved the settings into job {e.id}.", request, picked)

    @staticmethod
    def pick_row(evt: gr.SelectData):
        """A click on a row of the list picks its job."""
        row = evt.row_value if isinstance(evt.row_value, list) else None
        return row[1] if row and len(row) > 1 else gr.skip()

    def load(self, picked, request: gr.Request):
        try:
            entry = self.actions._own(picked, self._user(request))
        except InputError as e:
            self._refuse(e)
        values = st.values_from_settings(entry.settings, self.ctx.default_resolution)
        values.update({name: published(entry.images.get(name)) for name in st.IMAGES})   # the files it keeps
        gr.Info(f"Settings of queued job {entry.id} loaded.")
        return [values[name] for name in st.CONTROLS]

    # ---- wiring -----------------------------------------------------------------------------------------------------
    def wire(self, app: gr.Blocks) -> None:
        p, controls = self.parts, self.ctx.ui.controls()
        shown = [p.status, p.table, p.pick]
        quick = dict(show_progress="hidden", concurrency_limit=2, concurrency_id="queue")
        app.load(self.on_load, p.pick, shown, show_progress="hidden")
        p.timer.tick(self.tick, p.pick, [p.table, p.pick], show_progress="hidden", concurrency_limit=4,
                     concurrency_id="queue-refresh")
        p.table.select(self.pick_row, None, p.pick, show_progress="hidden", queue=False)
        adding = {**quick, "concurrency_id": "queue-add"}      # checks images: never holds the others' "queue"
        p.add.click(self.add, controls, shown, preprocess=False, **adding)
        p.add_images.click(self.add_images, [p.images, *controls], shown, preprocess=False, **adding)
        p.import_file.upload(self.import_jsonl, p.import_file, shown, preprocess=False, **adding)
        p.export.click(self.export, None, p.export_file, **quick)
        p.up.click(self.up, p.pick, shown, **quick)
        p.down.click(self.down, p.pick, shown, **quick)
        p.remove.click(self.remove, p.pick, shown, **quick)
        p.clear.click(self.clear_finished, None, shown, **quick)
        p.save.click(self.save, [p.pick, *controls], shown, preprocess=False, **adding)
        p.load.click(self.load, p.pick, controls, show_progress="hidden")


def wire_queue(ctx: AppContext, app: gr.Blocks, warning: str | None = None) -> QueuePanel:
    """The queue panel and the /queue_* API over the runner's queue (call inside the gr.Blocks being built, after
    the layout). `warning`: the store's (a damaged database moved aside), shown on the panel."""
    left = ctx.runner.store.entries([qs.WAITING, qs.RUNNING])      # before this runner: what the last run left
    if left:
        log.info("queue: %d job(s) waiting in %s", len(left), ctx.runner.store.path)
    actions = QueueActions(ctx.runner, ctx.access)
    panel = QueuePanel(ctx, actions, build_parts(), warning)
    panel.recovered = {e.id: e.status == qs.RUNNING or e.interrupted for e in left}
    panel.wire(app)
    QueueApi(actions).register(ctx.ui.controls())
    return panel
