"""Where the apex source comes from, and the proof that it is the configured commit.

Three kinds, checked in this order: apex.source.path (a git checkout, or a plain export with a `<dir>.source.json`
marker beside it), apex.source.tarball (with its sha256), apex.source.url (+ ref, fetched with git).
Nothing is ever built inside the user's source: `extract` copies the exact commit's files elsewhere.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from amprepro.env.apexbuild.errors import ApexError
from amprepro.env.apexbuild.treehash import tree_hash
from amprepro.safevalues import apex_problems, git_ref_problem, shorten

MARKER_SUFFIX = ".source.json"
EXPORT_HINT = "python -m amprepro.env.apexbuild export --git-dir <apex clone> --ref <ref> --dest <dir>"
# Only these transports, whatever the URL or the user's git config says: ext:: and friends run commands.
GIT_PROTOCOLS = ["-c", "protocol.allow=never", "-c", "protocol.https.allow=always", "-c", "protocol.ssh.allow=always",
                 "-c", "protocol.file.allow=always"]


@dataclass(frozen=True)
class Source:
    kind: str  # git-url | git-checkout | export | tarball
    location: str
    ref: str | None
    commit: str  # full sha
    verified_by: str
    notes: list[str] = field(default_factory=list)
    _git_dir: str | None = None
    _tar_prefix: str = ""

    def describe(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}

    def read_text(self, relative: str) -> str | None:
        """A file of the commit, without extracting the whole source."""
        if self.kind in ("git-url", "git-checkout"):
            shown = _run_git(["--git-dir", self._git_dir, "show", f"{self.commit}:{relative}"], check=False)
            return shown.stdout if shown.returncode == 0 else None
        if self.kind == "tarball":
            with tarfile.open(self.location) as tar:
                try:
                    member = tar.extractfile(self._tar_prefix + relative)
                except KeyError:
                    return None
                return member.read().decode() if member else None
        path = Path(self.location) / relative
        return path.read_text() if path.is_file() else None

    def extract(self, dest: Path) -> None:
        """Write the commit's files into dest (which must not exist)."""
        if self.kind in ("git-url", "git-checkout"):
            archive = subprocess.run(["git", *GIT_PROTOCOLS, "--git-dir", self._git_dir, "archive", "--format=tar",
                                      "--end-of-options", self.commit],
                                     capture_output=True, check=True)
            _extract_tar(tarfile.open(fileobj=io.BytesIO(archive.stdout)), dest, "")  # noqa: SIM115 (in memory)
        elif self.kind == "tarball":
            with tarfile.open(self.location) as tar:
                _extract_tar(tar, dest, self._tar_prefix)
        else:
            shutil.copytree(self.location, dest, symlinks=True)


def resolve(spec: dict, git_cache: Path) -> Source:
    """Identify the configured source and prove it is the pinned commit; ApexError when it is not."""
    problems = apex_problems({"source": spec})
    if problems:
        raise ApexError("; ".join(f"apex.{field} {problem}" for field, problem in problems) + ": fix the config.")
    path, tarball, url = spec.get("path"), spec.get("tarball"), spec.get("url")
    if path and tarball:
        raise ApexError("apex.source sets both path and tarball: keep one of them (either wins over url).")
    if path:
        return from_path(Path(path), spec)
    if tarball:
        return from_tarball(Path(tarball), spec)
    if url:
        return from_url(url, spec, git_cache)
    raise ApexError("No apex source is configured: set apex.source.url with ref and commit, "
                    "apex.source.path, or apex.source.tarball with sha256.")


def from_path(path: Path, spec: dict) -> Source:
    if not path.is_dir():
        raise ApexError(f"apex.source.path {path} is not a directory: fix the path (relative paths are relative to "
                        "the directory Snakemake runs in).")
    git_dir = _checkout_git_dir(path)
    if git_dir is not None:
        return _from_checkout(path, git_dir, spec)
    return _from_export(path, spec)


def _from_checkout(path: Path, git_dir: str, spec: dict) -> Source:
    head = _rev_parse(git_dir, "HEAD^{commit}")
    _check_commit(head, _required_commit(spec, f"apex.source.path {path}"), f"the git checkout {path} (HEAD)")
    notes = []
    if _run_git(["-C", str(path), "status", "--porcelain", "--untracked-files=no"]).stdout.strip():
        notes.append(f"{path} has uncommitted changes; they are ignored: commit {head[:12]} is built exactly")
    return Source("git-checkout", str(path), spec.get("ref"), head, "git HEAD of the checkout", notes, git_dir)


def _from_export(path: Path, spec: dict) -> Source:
    marker = export_marker(path)
    if not marker.is_file():
        raise ApexError(
            f"apex.source.path {path} is neither a git checkout nor an export with a {marker.name} beside it, so "
            f"nothing proves which commit it holds. Fix: export it with `{EXPORT_HINT}`, point apex.source.path at a "
            "git checkout, or use apex.source.tarball with its sha256.")
    recorded = json.loads(marker.read_text())
    _check_commit(recorded["commit"], _required_commit(spec, f"apex.source.path {path}"), f"{path} (per {marker.name})")
    actual = tree_hash(path, recorded.get("gitlinks", {}))
    if actual != recorded["tree"]:
        raise ApexError(
            f"{path} does not hold the files of commit {recorded['commit'][:12]}: their git tree hash is {actual}, "
            f"{marker.name} records {recorded['tree']}. The copy was edited or has build outputs in it; refusing to "
            f"build. Fix: re-export it (`{EXPORT_HINT}`).")
    return Source("export", str(path), spec.get("ref") or recorded.get("ref"), recorded["commit"],
                  f"git tree hash {actual} of the files equals the commit's tree recorded in {marker.name}")


def from_tarball(tarball: Path, spec: dict) -> Source:
    if not tarball.is_file():
        raise ApexError(f"apex.source.tarball {tarball} does not exist: fix the path.")
    wanted_sha = spec.get("sha256")
    if not wanted_sha:
        raise ApexError(f"apex.source.tarball {tarball} has no apex.source.sha256: set it "
                        f"(`sha256sum {tarball}` on a copy you trust) so the build is pinned.")
    actual_sha = file_sha256(tarball)
    if actual_sha != wanted_sha.lower():
        raise ApexError(f"{tarball} has sha256 {actual_sha}, but apex.source.sha256 is {wanted_sha}: refusing to "
                        "build a file that is not the pinned one. Fix: fetch the pinned tarball again, or update "
                        "sha256 only if you trust this file.")
    with tarfile.open(tarball) as tar:
        names = tar.getnames()
        embedded = tar.pax_headers.get("comment")
    wanted = spec.get("commit")
    if embedded:
        if wanted:
            _check_commit(embedded, wanted, f"{tarball} (commit id written by git archive)")
        commit, how = embedded, f"sha256 {actual_sha[:12]}… and the commit id git archive wrote into the tarball"
    elif wanted and len(wanted) == 40:
        commit = wanted.lower()
        how = f"sha256 {actual_sha[:12]}… (the tarball carries no commit id; commit as configured)"
    else:
        raise ApexError(f"{tarball} carries no commit id (it was not made by git archive) and apex.source.commit is "
                        "not a full 40-digit sha: set the full commit the tarball was made from.")
    return Source("tarball", str(tarball), spec.get("ref"), commit, how, _tar_prefix=_single_top_dir(names))


def from_url(url: str, spec: dict, git_cache: Path) -> Source:
    wanted = _required_commit(spec, f"apex.source.url {url}")
    ref = spec.get("ref") or wanted
    repo = git_cache / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    if not _has_commit(repo, wanted):
        _fetch(url, ref, wanted, repo)
    commit = _rev_parse(str(repo), f"{wanted}^{{commit}}")
    return Source("git-url", url, ref, commit, f"{url} {ref} resolved to it when fetched (clone kept in {repo})",
                  _git_dir=str(repo))


def _fetch(url: str, ref: str, wanted: str, repo: Path) -> None:
    if not repo.exists():
        _run_git(["init", "--quiet", "--bare", str(repo)])
    fetched = _run_git(["--git-dir", str(repo), "fetch", "--quiet", "--depth", "1", "--", url, ref], check=False)
    if fetched.returncode != 0:
        last = (fetched.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ApexError(
            f"git could not fetch {ref} from {url}: {last}. This machine may not reach that host. Fix: get the source "
            f"where the network allows and set apex.source.path to an export made with `{EXPORT_HINT}`, or "
            "apex.source.tarball to `git archive` output with apex.source.sha256.")
    got = _rev_parse(str(repo), "FETCH_HEAD^{commit}")
    _check_commit(got, wanted, f"{url} at {ref}")
    _run_git(["--git-dir", str(repo), "update-ref", f"refs/amprepro/{got}", got])


def export(git_dir: str, ref: str, dest: Path) -> dict:
    """Write commit `ref` of the repository at git_dir into dest, and the marker that lets a build check it later."""
    if problem := git_ref_problem(ref):
        raise ApexError(f"--ref {shorten(ref)} {problem}.")
    commit = _rev_parse(git_dir, f"{ref}^{{commit}}")
    tree = _rev_parse(git_dir, f"{commit}^{{tree}}")
    listing = _run_git(["--git-dir", git_dir, "ls-tree", "-r", "--end-of-options", commit]).stdout.splitlines()
    gitlinks = {line.split("\t", 1)[1]: line.split()[2] for line in listing if line.startswith("160000 ")}
    if dest.exists():
        raise ApexError(f"{dest} already exists: remove it or choose another --dest.")
    Source("git-checkout", git_dir, ref, commit, "export", _git_dir=git_dir).extract(dest)
    if tree_hash(dest, gitlinks) != tree:
        raise ApexError(f"the export in {dest} does not reproduce tree {tree} (export-ignore or export-subst "
                        "attributes?); use a git checkout as apex.source.path instead.")
    record = {"commit": commit, "tree": tree, "ref": ref, "gitlinks": gitlinks,
              "exported_from": str(Path(git_dir).resolve()), "made_by": "amprepro.env.apexbuild export (git archive)"}
    export_marker(dest).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
    return record


def export_marker(path: Path) -> Path:
    path = Path(path)
    return path.parent / (path.resolve().name + MARKER_SUFFIX)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _rev_parse(git_dir: str, revision: str) -> str:
    return _run_git(["--git-dir", git_dir, "rev-parse", "--verify", "--end-of-options", revision]).stdout.strip()


def _required_commit(spec: dict, where: str) -> str:
    commit = spec.get("commit")
    if not commit:
        raise ApexError(f"{where} is configured without apex.source.commit: pin the commit it must be "
                        "(apex 25.05 is 379937e1719b8190f38f3e666e2a8d32c97e221f).")
    return commit.lower()


def _check_commit(found: str, wanted: str, where: str) -> None:
    if not found.lower().startswith(wanted.lower()):
        raise ApexError(f"{where} is commit {found}, but apex.source.commit is {wanted}: refusing to build. Fix: "
                        f"point the source at commit {wanted}, or set apex.source.commit to {found} if that is the "
                        "one you mean to build.")


def _checkout_git_dir(path: Path) -> str | None:
    """The git dir when path is the top of a git work tree (not merely inside another repository)."""
    top = _run_git(["-C", str(path), "rev-parse", "--show-toplevel"], check=False, missing_ok=True)
    if top is None or top.returncode != 0 or Path(top.stdout.strip()).resolve() != path.resolve():
        return None
    return _run_git(["-C", str(path), "rev-parse", "--absolute-git-dir"]).stdout.strip()


def _has_commit(repo: Path, commit: str) -> bool:
    if not repo.exists():
        return False
    return _run_git(["--git-dir", str(repo), "cat-file", "-e", "--end-of-options", f"{commit}^{{commit}}"],
                    check=False).returncode == 0


def _run_git(args: list[str], check: bool = True, missing_ok: bool = False):
    try:
        done = subprocess.run(["git", *GIT_PROTOCOLS, *args], capture_output=True, text=True)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise ApexError("git is not installed here but the apex source needs it: install git, or use "
                        "apex.source.path with an export or apex.source.tarball.") from None
    if check and done.returncode != 0:
        raise ApexError(f"git {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def _single_top_dir(names: list[str]) -> str:
    """GitHub tarballs put everything under one directory; git archive without --prefix does not."""
    tops = {name.split("/", 1)[0] for name in names if name and name != "pax_global_header"}
    if len(tops) == 1 and (top := tops.pop()) + "/setup.py" in names:
        return top + "/"
    return ""


def _extract_tar(tar: tarfile.TarFile, dest: Path, prefix: str) -> None:
    dest.mkdir(parents=True)
    members = []
    for member in tar.getmembers():
        if not member.name.startswith(prefix) or member.name == prefix.rstrip("/"):
            continue
        member.name = member.name[len(prefix):]
        members.append(member)
    tar.extractall(dest, members=members, filter="tar")
