"""Run the README's commands as a newcomer would, on a fresh clone, virtualenv and home, and say which failed.

    python scripts/fresh_machine_check.py                        # the last commit
    python scripts/fresh_machine_check.py --worktree             # the working tree as it is (uncommitted files too)
    python scripts/fresh_machine_check.py --update-constraints   # resolve the newest releases pyproject allows,
                                                                 # write them to constraints.txt, then run

A CI run reuses the packages already installed on its machine, so it cannot see a new release breaking a test, nor a
test that collides with what the README's own commands leave in the checkout. This does what a new user does: a
clone in a temporary folder, a new virtualenv, ``HOME`` (so ``~/.cache/lightprune``, pip's cache and every other
per-user file) and ``TMPDIR`` in that folder, and then, in order and from the clone's root:

1. the README's first command (install, then the default job);
2. every command of the guides the README links to (docs/getting-started.md, docs/guides/*.md), in the README's
   order, except those that cannot run here: placeholders for the user's own files (``CKPT``, ``calib.jsonl``,
   ``/path/...``, ``...``), several GPUs or nodes (``torchrun``, ``srun``, ``--trainer.devices 8``), each skipped
   with its reason;
3. the README's test command (the whole suite, in the clone that steps 1-2 filled).

Each command runs under ``bash -e`` with the page's working directory (the repository root); its output goes to
``<folder>/logs/NN.log`` and one line per command says its exit status and time. docs/getting-started.md's
perplexities are checked against the first command's report, when that command passed, within the band the page
states. At the end: the last line of the last command's log that holds " in " (the test command's "N passed in S
s"), and the number of failed commands. The exit status is the number of failed commands (0: every command passed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: words of a command that stand for the user's own files or machines: such a command cannot run as shown
PLACEHOLDERS = ("CKPT", "...", "/path/", "HOST", "calib.jsonl", "train.jsonl", "val.jsonl", "a.jsonl", "b.jsonl")
#: commands for several GPUs or nodes
MULTI_DEVICE = ("torchrun", "srun", "--trainer.devices 8", "--trainer.accelerator gpu")


def bash_blocks(page: Path) -> list[str]:
    """The commands of a page's ```bash blocks, one per line (continuations joined, comments kept for bash)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(encoding="utf-8"), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip() and not line.strip().startswith("#"):
                commands.append(line.strip())
    return commands


def guide_pages(readme: Path) -> list[Path]:
    """docs/getting-started.md and the guides, in the order the README's table names them (then any others)."""
    root = readme.parent
    named = [root / m for m in re.findall(r"\| (docs/[\w/.-]+\.md) \|", readme.read_text(encoding="utf-8"))]
    pages = [p for p in named if p.parent.name == "guides" or p.name == "getting-started.md"]
    rest = sorted(p for p in (root / "docs" / "guides").glob("*.md") if p not in pages)
    return list(dict.fromkeys([root / "docs" / "getting-started.md", *pages, *rest]))


def why_not(command: str) -> str | None:
    """Why a documented command cannot run on this machine as shown (None: it can)."""
    words = shlex.split(command, comments=True)
    if any(m in command for m in MULTI_DEVICE):
        return "needs several GPUs or nodes"
    if any(w in PLACEHOLDERS or w.startswith("/path/") for w in words) or "..." in command:
        return "names the user's own files"
    return None


def plan(clone: Path) -> list[tuple[str, str, str | None]]:
    """(page, command, reason it is skipped or None), in the order a newcomer runs them."""
    readme = clone / "README.md"
    first, *rest = bash_blocks(readme)
    test = rest[-1] if rest else None
    steps: list[tuple[str, str, str | None]] = [("README.md", first, None)]
    seen = {first}
    for page in guide_pages(readme):
        for command in bash_blocks(page):
            if command in seen or command == test:
                continue
            seen.add(command)
            steps.append((str(page.relative_to(clone)), command, why_not(command)))
    if test is not None:
        steps.append(("README.md", test, None))
    return steps


def run(command: str, cwd: Path, env: dict[str, str], log: Path, timeout: float) -> tuple[int, float]:
    start = time.perf_counter()
    with log.open("w") as out:
        out.write(f"$ {command}\n")
        out.flush()
        try:
            done = subprocess.run(["bash", "-e", "-c", command], cwd=cwd, env=env, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=timeout, check=False)
            status = done.returncode
        except subprocess.TimeoutExpired:
            out.write(f"\n[stopped after {timeout:.0f} s]\n")
            status = 124
    return status, time.perf_counter() - start


#: variables of the calling shell a new user would not have: lightprune's, Python's, a virtualenv's, the suite's
_DROPPED = ("LIGHTPRUNE_", "PYTHON", "VIRTUAL_ENV", "CONDA_", "HF_", "TRANSFORMERS_", "CI", "PYTEST_")


def _other_python(entry: str) -> bool:
    """Whether a PATH entry is another Python's (its scripts would answer for commands the virtualenv lacks): one
    under the caller's home (pyenv's shims, a user install) or holding a ``python`` or ``pip`` of its own, the
    operating system's /usr/bin and /bin apart."""
    if entry in ("/usr/bin", "/bin"):
        return False
    folder = Path(entry)
    return folder.is_relative_to(Path.home()) or any((folder / n).exists() for n in ("python", "python3", "pip"))


def environment(folder: Path, venv: Path) -> dict[str, str]:
    """A new user's environment on this machine: the machine's variables (its package index, certificates,
    proxies), the virtualenv first on PATH and no other Python's folders there, HOME and TMPDIR in ``folder``, and
    none of :data:`_DROPPED`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    path = [e for e in env.get("PATH", "/usr/bin:/bin").split(":") if e and not _other_python(e)]
    env.update(HOME=str(folder / "home"), TMPDIR=str(folder / "tmp"), VIRTUAL_ENV=str(venv),
               PATH=":".join([str(venv / "bin"), *path]))
    for sub in ("home", "tmp"):
        (folder / sub).mkdir(exist_ok=True)
    return env


def clone_into(target: Path, worktree: bool) -> None:
    """The last commit (``git clone``), or with ``worktree`` every file git does not ignore, as it is now."""
    if not worktree:
        subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(target)], check=True)
        return
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    subprocess.run(["git", "init", "--quiet"], cwd=target, check=True)  # the suite's checkout guard reads git


def stated_figures(page: Path) -> tuple[float, float, float] | None:
    """(perplexity before, after, relative band) as docs/getting-started.md states them, or None."""
    text = " ".join(page.read_text(encoding="utf-8").split())
    found = re.search(r"held-out perplexity about ([\d.]+) before pruning and ([\d.]+) after \(within ([\d.]+)%", text)
    return None if found is None else (float(found[1]), float(found[2]), float(found[3]) / 100)


def check_figures(clone: Path) -> str:
    """The first command's report against the page's figures: a line saying whether they agree."""
    stated = stated_figures(clone / "docs" / "getting-started.md")
    report = clone / "outputs" / "quickstart" / "report.json"
    if stated is None:
        return "FAIL docs/getting-started.md states no perplexities in the form this check reads"
    if not report.is_file():
        return f"FAIL no {report.relative_to(clone)} to check docs/getting-started.md's figures against"
    evaluation = json.loads(report.read_text()).get("evaluation", {})
    got = tuple(evaluation.get(when, {}).get("perplexity") for when in ("before", "after"))
    if None in got:
        return f"FAIL {report.relative_to(clone)} holds no perplexity before and after"
    ok = all(abs(g - s) <= stated[2] * s for g, s in zip(got, stated[:2], strict=True))
    return (f"{'ok  ' if ok else 'FAIL'} perplexity {got[0]:.2f} before, {got[1]:.2f} after; docs/getting-started.md "
            f"says {stated[0]} and {stated[1]} within {stated[2]:.0%}")


def last_summary(ran: tuple[str, str, Path] | None) -> str:
    """One line on the last command that ran (``ran``: its page, command and log; the README's test command when the
    README has one, since it runs last and is never skipped): the last line of its log holding " in " (pytest's "N
    passed in S s"), or "no summary line"; "no command ran" when ``ran`` is None."""
    if ran is None:
        return "no command ran"
    page, command, log = ran
    found = [line for line in log.read_text(errors="replace").splitlines() if " in " in line][-1:]
    return f"the last command ({page}: {command}): {found[0] if found else 'no summary line'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--worktree", action="store_true", help="the working tree as it is, not the last commit")
    parser.add_argument("--update-constraints", action="store_true",
                        help="install without constraints.txt (the newest releases pyproject allows) and write what "
                             "was installed into constraints.txt (the clone's and this checkout's)")
    parser.add_argument("--folder", type=Path, help="where to work (default: a new temporary folder, kept)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per command")
    args = parser.parse_args()

    folder = args.folder or Path(tempfile.mkdtemp(prefix="lightprune-fresh-"))
    folder.mkdir(parents=True, exist_ok=True)
    clone, venv, logs = folder / "lightprune", folder / "venv", folder / "logs"
    logs.mkdir(exist_ok=True)
    clone_into(clone, args.worktree)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = environment(folder, venv)
    print(f"fresh clone, virtualenv and home in {folder}", flush=True)

    if args.update_constraints:
        status, _ = run("pip install torch==2.13.0 && pip install -e '.[dev]'", clone, env, logs / "resolve.log",
                        args.timeout)
        if status:
            print(f"FAIL resolving the newest releases (see {logs / 'resolve.log'})")
            return 1
        frozen = subprocess.run([str(venv / "bin" / "pip"), "freeze", "--exclude-editable"], env=env,
                                capture_output=True, text=True, check=True).stdout.splitlines()
        header = [line for line in (REPO / "constraints.txt").read_text().splitlines() if line.startswith("#")]
        pins = sorted((line for line in frozen if "==" in line and not line.lower().startswith(("torch==",
                                                                                                 "lightprune"))),
                      key=str.lower)
        for target in (REPO / "constraints.txt", clone / "constraints.txt"):
            target.write_text("\n".join([*header, *pins]) + "\n")
        print(f"constraints.txt: {len(pins)} pins written", flush=True)

    failed, ran = 0, None  # ran: (page, command, log) of the last command that ran
    for number, (page, command, skipped) in enumerate(plan(clone), start=1):
        if skipped:
            print(f"skip {page}: {command}  ({skipped})", flush=True)
            continue
        log = logs / f"{number:02d}.log"
        ran = page, command, log
        status, seconds = run(command, clone, env, log, args.timeout)
        failed += status != 0
        print(f"{'ok  ' if status == 0 else 'FAIL'} {seconds:7.1f} s  {page}: {command}"
              + ("" if status == 0 else f"  (exit {status}, {log})"), flush=True)
        if number == 1:  # the figures come from its report: a failed first command is its one failure
            line = check_figures(clone) if status == 0 else "skip the figures check: the first command failed"
            failed += line.startswith("FAIL")
            print(line, flush=True)
    print(last_summary(ran))
    print(f"{failed} failed; logs in {logs}")
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
