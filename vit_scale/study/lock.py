"""Who is running which runs of a study directory: a second study on the same runs is refused.

Two `jobs/weak_scaling.sh --out R` started at once both ran every run, side by side, and each
summary quoted the other's runs. Now a study holds a lock on each (model, node count) it plans, one
file each under OUT/STUDY/.vit-scale-locks/, from before its first line of output until it ends
(normal end, error, or SIGTERM: the Supervisor turns that into an orderly end). A lock per
(model, node count) and not one per directory: the jobs of `jobs/submit_sweep.sh` share one study
directory and run side by side, one node count (and model) each; they do not overlap, so they do
not refuse each other, while a sweep submitted twice, or a whole study beside a sweep, does.

A lock file is taken with link(2) of a fully written file of its own: atomic on NFS and Lustre,
where flock/fcntl locks are not reliable across nodes (Lustre mounted without `-o flock`); a lost
NFS reply is covered by checking the link count (the recipe of open(2)'s O_EXCL note). A reader
thus never sees half a lock. Filesystems without hard links fall back to O_CREAT|O_EXCL.

A lock whose holder is gone is taken over, with one line naming it: its process has ended (same
kernel and pid namespace: pid and start time from /proc/PID/stat, so a recycled pid is not taken
for the holder), its Slurm job is no longer running (squeue), or it is this very Slurm job before a
requeue (SLURM_RESTART_COUNT is lower; the job id is the same). A holder that cannot be checked
from here (another machine, no Slurm job) is named, with the command that removes its locks.
A takeover goes through a guard file; a guard left by a study that died in its takeover is aged
by this study's own clock, never by a file's mtime, which another machine's clock stamped.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shlex
import socket
import subprocess
import sys
import time
import uuid

from vit_scale.errors import UserError

LOCK_DIR = ".vit-scale-locks"
# squeue states (%T) in which a job's processes can no longer hold anything; any other (RUNNING,
# COMPLETING, SUSPENDED, STOPPED ...) counts as holding. PENDING: requeued, its old start is gone.
ENDED_STATES = {
    "PENDING",
    "COMPLETED",
    "CANCELLED",
    "FAILED",
    "TIMEOUT",
    "NODE_FAIL",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "OUT_OF_MEMORY",
    "REQUEUED",
    "REQUEUE_HOLD",
    "REQUEUE_FED",
    "SPECIAL_EXIT",
    "REVOKED",
}
ATTEMPTS = 50  # x RETRY_S: how long a lock that changes hands under us is tried again
RETRY_S = 0.1
TAKEOVER_STALE_S = 60  # a takeover guard seen this long (our own clock) was left by a study that died in its takeover


def lock_path(study_dir: str, model: str, nodes: int) -> str:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", model)
    return os.path.join(study_dir, LOCK_DIR, f"{safe}.n{nodes}.lock")


def _read_text(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def proc_stat(pid: int) -> tuple[str, str] | None:
    """(state, start time in clock ticks since boot) of a process, fields 3 and 22 of
    /proc/PID/stat; None when there is no such process (or no /proc)."""
    text = _read_text(f"/proc/{pid}/stat")
    if not text:
        return None
    fields = text[text.rfind(")") + 1 :].split()  # the command name may hold spaces and parentheses
    return fields[0], fields[19]


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def this_process(command: str) -> dict:
    """The lock record of this study: enough to find the holder again, to tell whether it still
    runs, and to tell a user who it is."""
    stat = proc_stat(os.getpid())
    job = os.environ.get("SLURM_JOB_ID")
    slurm = None
    if job:
        slurm = {
            "job_id": job,
            "step_id": os.environ.get("SLURM_STEP_ID", "batch"),
            "restart_count": int(os.environ.get("SLURM_RESTART_COUNT") or 0),
            "cluster": os.environ.get("SLURM_CLUSTER_NAME", ""),
            "node": os.environ.get("SLURMD_NODENAME", ""),
        }
    return {
        "version": 1,
        "token": uuid.uuid4().hex,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "process_start": stat[1] if stat else None,
        "boot_id": _read_text("/proc/sys/kernel/random/boot_id"),
        "pid_namespace": _pid_namespace(),
        "user": _user(),
        "command": command,
        "since": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "slurm": slurm,
    }


def describe(holder: dict) -> str:
    """Who holds it, in words: the Slurm job when there is one, host and pid, and its command."""
    command = " ".join(str(holder.get("command", "?")).split())
    if len(command) > 400:
        command = command[:397] + "..."
    where = f"{holder.get('host', '?')} pid {holder.get('pid', '?')}"
    facts = f"{holder.get('user', '?')}, since {holder.get('since', '?')}: {command}"
    slurm = holder.get("slurm")
    if slurm:
        step = f" step {slurm['step_id']}" if slurm.get("step_id") not in (None, "", "batch") else ""
        return f"Slurm job {slurm['job_id']}{step} ({where}, {facts})"
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')} ({facts})"


# ----------------------------------------------------------------------------- is the holder there


def _same_kernel(holder: dict, me: dict) -> bool:
    """Whether a pid in the record means the same process here: same boot of the same kernel and
    same pid namespace (containers on one host share the boot but not the pids)."""
    if holder.get("boot_id") and me["boot_id"]:
        return holder["boot_id"] == me["boot_id"] and holder.get("pid_namespace") == me["pid_namespace"]
    return holder.get("host") == me["host"]  # no /proc here (macOS): the host name is all there is


def _process_state(holder: dict) -> tuple[str, str]:
    pid = holder.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return "unknown", "names no process"
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return "gone", "has ended"
    except PermissionError:
        pass  # another user's process: it exists
    stat = proc_stat(pid)
    if stat is None:
        return "held", "is running"  # no /proc: the pid exists, which is all that can be told
    state, start = stat
    if state in ("Z", "X"):
        return "gone", "has ended"
    if holder.get("process_start") and start != holder["process_start"]:
        return "gone", "has ended (its pid now belongs to another process)"
    return "held", "is running"


def _this_cluster() -> str:
    name = os.environ.get("SLURM_CLUSTER_NAME")
    if name:
        return name
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""
    found = re.search(r"^ClusterName\s*=\s*(\S+)", out, re.M)
    return found.group(1) if found else ""


def _slurm_job_state(slurm: dict) -> tuple[str, str]:
    job, cluster = str(slurm.get("job_id")), slurm.get("cluster") or ""
    here = _this_cluster()
    if cluster and here and cluster != here:
        return "unknown", f"is a job of Slurm cluster {cluster}, which cannot be checked from {here}"
    try:
        proc = subprocess.run(
            ["squeue", "-h", "-t", "all", "-j", job, "-o", "%T"], capture_output=True, text=True, timeout=30
        )
    except FileNotFoundError:
        return "unknown", "is a Slurm job that cannot be checked here: no squeue"
    except subprocess.SubprocessError:
        return "unknown", "is a Slurm job that cannot be checked now: squeue did not answer"
    state = (proc.stdout.split() or [""])[0]
    if proc.returncode == 0 and state:
        return ("gone", f"has ended (job {state})") if state in ENDED_STATES else ("held", f"is running (job {state})")
    if "Invalid job id" in proc.stderr:
        return "gone", "has ended (Slurm no longer lists its job)"
    said = " ".join(proc.stderr.split())[:120] or "no answer"
    return "unknown", f"is a Slurm job that squeue could not check ({said})"


def holder_state(holder: dict, me: dict) -> tuple[str, str]:
    """("held" | "gone" | "unknown", words for the user). The process itself when this kernel can
    see it; else its Slurm job; else nobody can tell from here."""
    if not holder:
        return "unknown", "cannot be read"
    if _same_kernel(holder, me):
        return _process_state(holder)
    slurm, mine = holder.get("slurm") or {}, me.get("slurm") or {}
    if not slurm.get("job_id"):
        return "unknown", "runs on another machine, where it cannot be checked from here"
    if mine and str(slurm["job_id"]) == mine["job_id"] and (slurm.get("cluster") or "") == mine["cluster"]:
        # our own job id: squeue would say RUNNING about ourselves
        if int(slurm.get("restart_count") or 0) < mine["restart_count"]:
            return "gone", "was this job before it was requeued"
        return "held", "is another step of this job"
    return _slurm_job_state(slurm)


# ----------------------------------------------------------------------------- taking and leaving


def _write_new(path: str, record: dict) -> bool:
    """Create `path` holding `record`, only if it does not exist; True if this call created it."""
    tmp = f"{path}.{record['host']}.{record['pid']}.{uuid.uuid4().hex[:8]}.tmp"
    with open(tmp, "w") as f:
        json.dump(record, f)
    try:
        os.link(tmp, path)
    except OSError as exc:
        if exc.errno in (errno.EPERM, errno.ENOSYS, errno.EOPNOTSUPP):  # no hard links on this filesystem
            return _create_exclusive(path, record)
        # an NFS reply lost on the way reports a link that was made as failed (EEXIST on the retry)
        if os.stat(tmp).st_nlink == 2:
            return True
        if exc.errno == errno.EEXIST:
            return False
        raise
    else:
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _create_exclusive(path: str, record: dict) -> bool:
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as f:
        json.dump(record, f)
    return True


def _read_lock(path: str) -> dict | None:
    """The record, None when there is no lock, {} when the file cannot be read as one."""
    try:
        with open(path) as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        record = json.loads(text)
    except ValueError:
        return {}
    return record if isinstance(record, dict) else {}


def _take_over(path: str, stale: dict, me: dict, guards: dict) -> str:
    """Replace the lock of a holder that is gone with ours: "taken", "lost" (someone else was
    first) or "guarded" (another study's takeover is under way: try again). A guard file makes the
    check and the replacement one step: two studies both finding the same stale lock must not both
    win.

    A guard is left only by a study that died in those milliseconds, and is removed when its writer
    is known to be gone or once this study has seen that same guard (its token) for
    TAKEOVER_STALE_S by its own monotonic clock (`guards`: token -> when first seen). Never by the
    guard's mtime against this host's clock: the file server (or on Lustre the writing client)
    stamps the mtime, and with more than TAKEOVER_STALE_S of skew between them a live guard would
    look stale and two studies could both take the lock over."""
    guard = path + ".takeover"
    if not _write_new(guard, me):
        held = _read_lock(guard)
        if held is None:
            return "lost"  # gone meanwhile: try again at once
        token = held.get("token") or json.dumps(held, sort_keys=True)
        seen = guards.setdefault(token, time.monotonic())
        if holder_state(held, me)[0] == "gone" or time.monotonic() - seen > TAKEOVER_STALE_S:
            again = _read_lock(guard)
            if again is not None and (again.get("token") or json.dumps(again, sort_keys=True)) == token:
                with contextlib.suppress(OSError):
                    os.unlink(guard)
            return "lost"
        return "guarded"
    try:
        current = _read_lock(path)
        if current is not None and current.get("token") != stale.get("token"):
            return "lost"  # another study took it over first
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return "taken" if _write_new(path, me) else "lost"
    finally:
        with contextlib.suppress(OSError):
            os.unlink(guard)


class Refused(Exception):
    def __init__(self, path: str, holder: dict, state: str, why: str):
        super().__init__(why)
        self.path, self.holder, self.state, self.why = path, holder, state, why


def take(path: str, me: dict) -> dict | None:
    """Take one lock: None when it was free, the old holder's record (with its "why") when it
    was taken over; Refused when someone holds it or nobody can tell. Waiting on another study's
    takeover guard counts no attempt (it ends in milliseconds, or is stale after TAKEOVER_STALE_S)."""
    unreadable, held, guards, attempts = 0, None, {}, 0
    while attempts < ATTEMPTS:
        attempts += 1
        if _write_new(path, me):
            return None
        held = _read_lock(path)
        if held is None:
            continue  # released between the two calls
        if not held and unreadable < 10:
            unreadable += 1  # created with O_EXCL and not written yet (a filesystem without links)
            time.sleep(RETRY_S)
            continue
        state, why = holder_state(held, me)
        if state != "gone":
            raise Refused(path, held, state, why)
        outcome = _take_over(path, held, me, guards)
        if outcome == "taken":
            return {**held, "why": why}
        if outcome == "guarded":
            attempts -= 1
        time.sleep(RETRY_S)
    raise Refused(path, held or {}, "unknown", "another study is taking over just now; try again")


def release(path: str, me: dict) -> str | None:
    """Remove our lock; the record of whoever replaced it, if someone did (then it stays)."""
    held = _read_lock(path)
    if held is None:
        return None
    if held.get("token") != me["token"]:
        return describe(held) if held else path
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return None


def locks_of(path: str, holder: dict) -> list:
    """Every lock file beside `path` that `holder` took: what to remove when it is known to be gone."""
    folder = os.path.dirname(path)
    try:
        names = sorted(n for n in os.listdir(folder) if n.endswith(".lock"))
    except OSError:
        return [path]
    found = [
        os.path.join(folder, n)
        for n in names
        if (_read_lock(os.path.join(folder, n)) or {}).get("token") == holder.get("token")
    ]
    return found or [path]


class StudyLock:
    """The locks of one study for as long as it runs (a context manager)."""

    def __init__(self, study_dir: str, runs: list, command: str, prog: str):
        self.study_dir = study_dir
        self.paths = sorted({lock_path(study_dir, model, nodes) for model, nodes in runs})
        self.prog = prog
        self.me = this_process(command)
        self.held: list[str] = []

    @classmethod
    def for_study(cls, study, prog: str, argv: list):
        """A study's locks; a dry run and --analysis-only start no run, so they take none."""
        if study.dry_run or study.analysis_only or not study.plan.runs:
            return contextlib.nullcontext()
        return cls(
            study.study_dir,
            [(run.model, run.nodes) for run in study.plan.runs],
            " ".join([prog, shlex.join(argv)]),
            prog,
        )

    def __enter__(self):
        taken_over: dict = {}
        try:
            os.makedirs(os.path.join(self.study_dir, LOCK_DIR), exist_ok=True)
            # the same order in every study: of two overlapping studies, one gets all it needs
            for path in self.paths:
                old = take(path, self.me)
                self.held.append(path)
                if old:
                    taken_over.setdefault(old.get("token"), old)
        except Refused as refused:
            self._leave()
            raise UserError(self._refusal(refused)) from None
        except OSError as exc:
            self._leave()
            raise UserError(f"--out: cannot lock {self.study_dir}: {exc.strerror} ({exc.filename})") from None
        for old in taken_over.values():
            print(
                f"{self.prog}: took over {self.study_dir} from {describe(old)}, which {old['why']}",
                file=sys.stderr,
                flush=True,
            )
        return self

    def __exit__(self, *exc):
        self._leave()
        return False

    def _leave(self) -> None:
        while self.held:
            path = self.held.pop()
            try:
                other = release(path, self.me)
            except OSError:
                continue
            if other:
                print(f"{self.prog}: {path} was taken over by {other} while this study ran", file=sys.stderr)

    def _refusal(self, refused: Refused) -> str:
        if not refused.holder:
            return (
                f"{self.study_dir}: {refused.path} is not a lock this version can read; if no study runs there: "
                f"rm {shlex.quote(refused.path)}; or use another --out"
            )
        text = f"{self.study_dir} is in use by {describe(refused.holder)}, which {refused.why}"
        if refused.state == "held":
            return text + "; wait for it to end (or stop it), or use another --out"
        return (
            text + f"; if it has ended: rm {' '.join(map(shlex.quote, locks_of(refused.path, refused.holder)))}"
            f"; or use another --out"
        )
