"""Who sees what: the users of `--auth`, whose jobs and queue entries each may see and control, and the one lookup of
a job folder by its id.

Without `--auth` there are no users: everyone who reaches the app sees everything (the log and the page say so when
the app is on a network). With one user, that user sees everything (the jobs made before the login was set too).
With several, each sees and controls only the jobs and queue entries they started; `--admin NAME` users see all,
and jobs without an owner (made before the logins, or by the command line) are seen by admins only.

A job is named by its id (its folder's name) and found by comparing names, never by turning the text into a path;
a job the user may not see is "not there", with the same message as a job that does not exist.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from common.errors import InputError
from jobfolder.folder import load_job
from pipeline.request import shown
from ui.guard import client_key


@dataclass(frozen=True)
class Access:
    users: frozenset = frozenset()          # the --auth user names (empty: no login)
    admins: frozenset = frozenset()         # --admin names (and the only user, when there is one)
    forwarded: bool = False                 # --share: a client through the share tunnel is its forwarded address

    @classmethod
    def of(cls, auth_pairs, admins=(), forwarded: bool = False) -> "Access":
        users = frozenset(user for user, _ in (auth_pairs or ()))
        admins = frozenset(admins or ()) | (users if len(users) == 1 else frozenset())
        return cls(users, admins, forwarded)

    @property
    def login(self) -> bool:
        return bool(self.users)

    def user(self, request) -> str | None:
        """The logged-in user of a Gradio request (None without logins)."""
        if not self.users:
            return None
        name = getattr(request, "username", None)
        return name if isinstance(name, str) else ""

    def client(self, request) -> str | None:
        """Who a Gradio request comes from, as the app's limits key it (ui/guard.py client_key: "login NAME", else
        "address HOST"): what a queue entry records and the queue's per-client cap counts. None without a request
        (a call from inside the app)."""
        return client_key(request, forwarded=self.forwarded) if request is not None else None

    def sees(self, user: str | None, owner) -> bool:
        """May `user` see and control what `owner` started?"""
        if not self.users or user in self.admins:
            return True
        return bool(user) and owner == user

    def job_folder(self, outputs: Path, job_id, user: str | None, field: str) -> Path:
        """The folder of the job `job_id` in `outputs`, if `user` may see it. Raises InputError naming `field`
        (the same message for a job that is not there and for one of another user's)."""
        outputs = Path(outputs)
        if isinstance(job_id, str) and job_id and not job_id.startswith(".") and outputs.is_dir():
            for d in outputs.iterdir():
                if d.name == job_id and d.is_dir() and self.sees(user, job_owner(d)):
                    return d
        raise InputError(field, f"there is no job {shown(job_id)} in the outputs folder; use a job_id from the Past "
                                f"jobs panel or a /video summary")


def job_owner(job_dir: Path) -> str | None:
    """The user who started the job (job.json's "owner"); None for none or an unreadable record."""
    try:
        owner = load_job(job_dir).get("owner")
    except (OSError, ValueError):
        return None
    return owner if isinstance(owner, str) else None
