"""Which code a run measured. A GPU machine may be handed a copy of the working tree whose
git metadata is older than its files: the commit alone would then name code that did not run,
so where the files differ from it, the hash of the tree they make is printed beside it
(`git rev-parse COMMIT^{tree}` names the commit that has that tree)."""
from __future__ import annotations

import os
import subprocess
import tempfile


def _git(root: str, *args: str, env: dict[str, str] | None = None) -> str:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, env=env)
    return out.stdout.strip() if out.returncode == 0 else ""


def revision(root: str) -> str:
    """The commit, and where the files (tracked, and untracked ones git does not ignore) differ
    from it, the hash of their tree."""
    head = _git(root, "rev-parse", "--short", "HEAD")
    if not head:
        return "unknown"
    with tempfile.TemporaryDirectory() as scratch:
        # A scratch index, so that the repository's own staging is left as it was.
        env = {**os.environ, "GIT_INDEX_FILE": os.path.join(scratch, "index")}
        _git(root, "read-tree", "HEAD", env=env)
        _git(root, "add", "-A", env=env)
        files = _git(root, "write-tree", env=env)
    if not files or files == _git(root, "rev-parse", "HEAD^{tree}"):
        return head
    return f"{head} with changes (the files' tree {files[:12]})"
