"""amprepro.env.apexbuild.source, every branch with its exact outcome: what each kind of source records (kind, location,
ref, commit, how it was verified, notes), each refusal's whole message, the tarball's prefix, the kept clone's name,
the export's marker and what the helpers return at their edges (docs/mutation.md: these tests, with
test_apex_source.py, are what kills the module's mutants). No network: the remotes are file:// repositories."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import tarfile

import pytest
from apex_fakes import FAKE_APEX, git, make_repo

from amprepro.env.apexbuild import ApexError
from amprepro.env.apexbuild import source as src
from amprepro.env.apexbuild.source import Source, export, export_marker, resolve

OTHER = "0123456789abcdef0123456789abcdef01234567"
URL_PROBLEM = ("is not an https://, ssh:// or file:// URL or user@host:path (other git transports, such as ext::, "
               "can run commands, and a value starting with '-' would be read as an option)")


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "apex"
    return path, make_repo(FAKE_APEX, path)


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def add_file(tar: tarfile.TarFile, name: str, data: bytes = b"x\n") -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def add_dir(tar: tarfile.TarFile, name: str) -> None:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    tar.addfile(info)


def raises(call, *args) -> str:
    with pytest.raises(ApexError) as error:
        call(*args)
    return str(error.value)


# ---- resolve: which kind, and the refusals before any ---------------------------------------------------------------


def test_a_refused_value_is_named_with_its_field_and_every_problem(tmp_path):
    assert raises(resolve, {"url": "ext::x", "ref": "-b"}, tmp_path) == (
        f"apex.source.url 'ext::x' {URL_PROBLEM}; apex.source.ref '-b' is not a tag, branch or commit name (letters, "
        "digits and . _ / + -, not starting with '-', '.' or '/', no '..', at most 200 characters): fix the config.")


def test_path_and_tarball_together_and_no_source_are_refused_whole(tmp_path):
    assert raises(resolve, {"path": "a", "tarball": "b"}, tmp_path) == (
        "apex.source sets both path and tarball: keep one of them (either wins over url).")
    assert raises(resolve, {}, tmp_path) == (
        "No apex source is configured: set apex.source.url with ref and commit, apex.source.path, or "
        "apex.source.tarball with sha256.")


def test_a_path_wins_over_a_url_and_a_tarball_over_a_url(repo, tmp_path):
    path, commit = repo
    spec = {"url": "https://127.0.0.1:9/apex.git", "commit": commit}
    assert resolve({**spec, "path": str(path)}, tmp_path / "git").kind == "git-checkout"
    tarball = tmp_path / "a.tar"
    subprocess.run(["git", "archive", "--format=tar", "-o", str(tarball), "HEAD"], cwd=path, check=True)
    assert resolve({**spec, "tarball": str(tarball), "sha256": sha256(tarball)}, tmp_path / "git").kind == "tarball"
    assert not (tmp_path / "git").exists()  # the URL was never fetched


def test_a_path_that_is_no_directory_is_refused(tmp_path):
    assert raises(resolve, {"path": str(tmp_path / "none"), "commit": OTHER}, tmp_path) == (
        f"apex.source.path {tmp_path / 'none'} is not a directory: fix the path (relative paths are relative to the "
        "directory Snakemake runs in).")


# ---- a git checkout ------------------------------------------------------------------------------------------------


def test_a_checkout_records_what_it_is_and_reads_the_commits_files(repo, tmp_path):
    path, commit = repo
    source = resolve({"path": str(path), "commit": commit[:7], "ref": "v1"}, tmp_path / "git")
    assert source.describe() == {"kind": "git-checkout", "location": str(path), "ref": "v1", "commit": commit,
                                 "verified_by": "git HEAD of the checkout", "notes": []}
    assert source._git_dir == str(path / ".git")
    assert source.read_text("setup.py") == (FAKE_APEX / "setup.py").read_text()
    assert source.read_text("no/such/file") is None


def test_a_checkout_with_edits_says_they_are_ignored_and_builds_the_commit(repo, tmp_path):
    path, commit = repo
    (path / "setup.py").write_text("# edited\n")
    (path / "untracked.txt").write_text("not in the commit\n")
    source = resolve({"path": str(path), "commit": commit}, tmp_path / "git")
    assert source.notes == [f"{path} has uncommitted changes; they are ignored: commit {commit[:12]} is built exactly"]
    assert source.read_text("setup.py") == (FAKE_APEX / "setup.py").read_text()
    source.extract(tmp_path / "deep" / "copy")
    assert (tmp_path / "deep" / "copy" / "setup.py").read_text() == (FAKE_APEX / "setup.py").read_text()
    assert not (tmp_path / "deep" / "copy" / "untracked.txt").exists()


def test_an_untracked_file_alone_is_no_edit(repo, tmp_path):
    path, commit = repo
    (path / "untracked.txt").write_text("x\n")
    assert resolve({"path": str(path), "commit": commit}, tmp_path / "git").notes == []


def test_a_checkout_at_another_commit_is_refused_whole(repo, tmp_path):
    path, commit = repo
    assert raises(resolve, {"path": str(path), "commit": OTHER[:10]}, tmp_path) == (
        f"the git checkout {path} (HEAD) is commit {commit}, but apex.source.commit is {OTHER[:10]}: refusing to "
        f"build. Fix: point the source at commit {OTHER[:10]}, or set apex.source.commit to {commit} if that is the "
        "one you mean to build.")


def test_a_source_without_a_commit_is_refused_whole(repo, tmp_path):
    path, _ = repo
    assert raises(resolve, {"path": str(path)}, tmp_path) == (
        f"apex.source.path {path} is configured without apex.source.commit: pin the commit it must be (apex 25.05 is "
        "379937e1719b8190f38f3e666e2a8d32c97e221f).")
    assert raises(resolve, {"url": "https://127.0.0.1:9/a.git", "commit": None}, tmp_path).startswith(
        "apex.source.url https://127.0.0.1:9/a.git is configured without apex.source.commit")


def test_a_folder_inside_a_checkout_is_not_the_checkout(repo, tmp_path):
    path, _ = repo
    assert src._checkout_git_dir(path / "ext_src") is None
    assert src._checkout_git_dir(path) == str((path / ".git").resolve())
    assert src._checkout_git_dir(tmp_path) is None  # not in a repository at all


# ---- an export -----------------------------------------------------------------------------------------------------


def test_an_export_records_its_commit_tree_ref_and_marker(repo, tmp_path):
    path, commit = repo
    dest = tmp_path / "out" / "apex-export"
    record = export(str(path / ".git"), "HEAD", dest)
    tree = git(path, "rev-parse", "HEAD^{tree}")
    assert record == {"commit": commit, "tree": tree, "ref": "HEAD", "gitlinks": {},
                      "exported_from": str((path / ".git").resolve()),
                      "made_by": "amprepro.env.apexbuild export (git archive)"}
    marker = tmp_path / "out" / "apex-export.source.json"
    assert export_marker(dest) == marker
    assert marker.read_text() == json.dumps(record, indent=2, sort_keys=True) + "\n"
    source = resolve({"path": str(dest), "commit": commit}, tmp_path / "git")
    assert source.describe() == {
        "kind": "export", "location": str(dest), "ref": "HEAD", "commit": commit,
        "verified_by": (f"git tree hash {tree} of the files equals the commit's tree recorded in "
                        "apex-export.source.json"),
        "notes": []}
    assert resolve({"path": str(dest), "commit": commit, "ref": "mine"}, tmp_path / "git").ref == "mine"
    assert source.read_text("setup.py") == (FAKE_APEX / "setup.py").read_text()
    assert source.read_text("ext_src") is None  # a folder is no file
    assert source.read_text("missing.txt") is None


def test_an_export_is_copied_with_its_links_as_links(repo, tmp_path):
    path, _ = repo
    os.symlink("setup.py", path / "link.py")
    git(path, "add", "link.py")
    git(path, "commit", "--quiet", "-m", "link")
    dest = tmp_path / "export"
    export(str(path / ".git"), "HEAD", dest)
    source = resolve({"path": str(dest), "commit": git(path, "rev-parse", "HEAD")}, tmp_path / "git")
    source.extract(tmp_path / "copy")
    assert os.readlink(tmp_path / "copy" / "link.py") == "setup.py"


def test_export_marker_names_the_folder_by_its_real_name(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink("real", tmp_path / "alias")
    assert export_marker(tmp_path / "alias") == tmp_path / "real.source.json"
    assert export_marker(str(tmp_path / "real")) == tmp_path / "real.source.json"


def test_an_export_refusals_are_whole(repo, tmp_path):
    path, commit = repo
    plain = tmp_path / "plain"
    plain.mkdir()
    assert raises(resolve, {"path": str(plain), "commit": commit}, tmp_path) == (
        f"apex.source.path {plain} is neither a git checkout nor an export with a plain.source.json beside it, so "
        f"nothing proves which commit it holds. Fix: export it with `{src.EXPORT_HINT}`, point apex.source.path at a "
        "git checkout, or use apex.source.tarball with its sha256.")
    dest = tmp_path / "export"
    record = export(str(path / ".git"), "HEAD", dest)
    assert raises(resolve, {"path": str(dest), "commit": OTHER}, tmp_path).startswith(
        f"{dest} (per export.source.json) is commit {commit}, but apex.source.commit is {OTHER}")
    (dest / "setup.py").write_text("# edited\n")
    actual = src.tree_hash(dest, {})
    assert raises(resolve, {"path": str(dest), "commit": commit}, tmp_path) == (
        f"{dest} does not hold the files of commit {commit[:12]}: their git tree hash is {actual}, "
        f"export.source.json records {record['tree']}. The copy was edited or has build outputs in it; refusing to "
        f"build. Fix: re-export it (`{src.EXPORT_HINT}`).")


def test_an_export_marker_without_a_ref_or_gitlinks_still_proves_the_commit(repo, tmp_path):
    path, commit = repo
    dest = tmp_path / "export"
    record = export(str(path / ".git"), "HEAD", dest)
    export_marker(dest).write_text(json.dumps({"commit": commit, "tree": record["tree"]}))
    source = resolve({"path": str(dest), "commit": commit}, tmp_path / "git")
    assert (source.kind, source.ref) == ("export", None)


def test_export_refuses_an_existing_destination_and_an_export_that_is_not_the_tree(repo, tmp_path):
    path, _ = repo
    (tmp_path / "taken").mkdir()
    assert raises(export, str(path / ".git"), "HEAD", tmp_path / "taken") == (
        f"{tmp_path / 'taken'} already exists: remove it or choose another --dest.")
    (path / ".gitattributes").write_text("README.md export-ignore\n")
    git(path, "add", ".gitattributes")
    git(path, "commit", "--quiet", "-m", "attributes")
    tree = git(path, "rev-parse", "HEAD^{tree}")
    assert raises(export, str(path / ".git"), "HEAD", tmp_path / "ignored") == (
        f"the export in {tmp_path / 'ignored'} does not reproduce tree {tree} (export-ignore or export-subst "
        "attributes?); use a git checkout as apex.source.path instead.")
    assert not export_marker(tmp_path / "ignored").exists()


def test_export_refuses_a_ref_that_could_be_an_option_whole(repo, tmp_path):
    path, _ = repo
    assert raises(export, str(path / ".git"), "-x", tmp_path / "out") == (
        "--ref '-x' is not a tag, branch or commit name (letters, digits and . _ / + -, not starting with '-', '.' or "
        "'/', no '..', at most 200 characters).")


def test_export_records_a_submodules_commit(repo, tmp_path):
    path, _ = repo
    git(path, "update-index", "--add", "--cacheinfo", f"160000,{OTHER},third_party/lib")
    git(path, "commit", "--quiet", "-m", "submodule")
    record = export(str(path / ".git"), "HEAD", tmp_path / "out")
    assert record["gitlinks"] == {"third_party/lib": OTHER}


# ---- a tarball -----------------------------------------------------------------------------------------------------


def git_tar(path, dest, prefix=""):
    subprocess.run(["git", "archive", "--format=tar", f"--prefix={prefix}", "-o", str(dest), "HEAD"], cwd=path,
                   check=True)
    return dest


def test_a_git_archive_tarball_records_its_embedded_commit_and_prefix(repo, tmp_path):
    path, commit = repo
    tarball = git_tar(path, tmp_path / "apex.tar", prefix="apex-25.05/")
    digest = sha256(tarball)
    source = resolve({"tarball": str(tarball), "sha256": digest.upper(), "ref": "25.05"}, tmp_path / "git")
    assert source.describe() == {
        "kind": "tarball", "location": str(tarball), "ref": "25.05", "commit": commit,
        "verified_by": f"sha256 {digest[:12]}… and the commit id git archive wrote into the tarball", "notes": []}
    assert source._tar_prefix == "apex-25.05/"
    assert source.read_text("setup.py") == (FAKE_APEX / "setup.py").read_text()
    assert source.read_text("missing.py") is None
    assert source.read_text("ext_src") is None  # a folder member has no file to read
    source.extract(tmp_path / "x" / "out")
    assert sorted(p.name for p in (tmp_path / "x" / "out").iterdir()) == sorted(
        p.name for p in FAKE_APEX.iterdir() if p.name != "__pycache__")
    assert src.from_tarball(tarball, {"sha256": digest, "commit": commit[:7].upper()}).commit == commit


def test_a_tarball_without_a_top_folder_has_no_prefix(repo, tmp_path):
    path, _ = repo
    tarball = git_tar(path, tmp_path / "apex.tar")
    source = resolve({"tarball": str(tarball), "sha256": sha256(tarball)}, tmp_path / "git")
    assert source._tar_prefix == ""
    source.extract(tmp_path / "out")
    assert (tmp_path / "out" / "setup.py").is_file()


def test_a_tarball_without_a_commit_id_takes_the_full_configured_commit(tmp_path):
    tarball = tmp_path / "plain.tar"
    with tarfile.open(tarball, "w") as tar:
        add_file(tar, "setup.py")
    digest = sha256(tarball)
    source = src.from_tarball(tarball, {"sha256": digest, "commit": OTHER.upper()})  # as resolve has checked it
    assert (source.commit, source.verified_by) == (
        OTHER, f"sha256 {digest[:12]}… (the tarball carries no commit id; commit as configured)")
    message = (f"{tarball} carries no commit id (it was not made by git archive) and apex.source.commit is not a "
               "full 40-digit sha: set the full commit the tarball was made from.")
    assert raises(resolve, {"tarball": str(tarball), "sha256": digest, "commit": OTHER[:39]}, tmp_path) == message
    assert raises(resolve, {"tarball": str(tarball), "sha256": digest}, tmp_path) == message


def test_a_tarball_refusals_are_whole(repo, tmp_path):
    path, commit = repo
    missing = tmp_path / "none.tar"
    assert raises(resolve, {"tarball": str(missing)}, tmp_path) == (
        f"apex.source.tarball {missing} does not exist: fix the path.")
    tarball = git_tar(path, tmp_path / "apex.tar")
    assert raises(resolve, {"tarball": str(tarball), "sha256": ""}, tmp_path) == (
        f"apex.source.tarball {tarball} has no apex.source.sha256: set it (`sha256sum {tarball}` on a copy you "
        "trust) so the build is pinned.")
    digest = sha256(tarball)
    assert raises(resolve, {"tarball": str(tarball), "sha256": "0" * 64}, tmp_path) == (
        f"{tarball} has sha256 {digest}, but apex.source.sha256 is {'0' * 64}: refusing to build a file that is not "
        "the pinned one. Fix: fetch the pinned tarball again, or update sha256 only if you trust this file.")
    assert raises(resolve, {"tarball": str(tarball), "sha256": digest, "commit": OTHER}, tmp_path) == (
        f"{tarball} (commit id written by git archive) is commit {commit}, but apex.source.commit is {OTHER}: "
        f"refusing to build. Fix: point the source at commit {OTHER}, or set apex.source.commit to {commit} if that "
        "is the one you mean to build.")


def test_the_single_top_folder_is_a_prefix_only_with_setup_py_in_it():
    assert src._single_top_dir(["pax_global_header", "apex/", "apex/setup.py", "apex/a/b.py"]) == "apex/"
    assert src._single_top_dir(["apex/", "apex/setup.cfg"]) == ""
    assert src._single_top_dir(["a/setup.py", "b/setup.py"]) == ""
    assert src._single_top_dir(["setup.py"]) == ""
    assert src._single_top_dir(["", "apex/setup.py"]) == "apex/"
    assert src._single_top_dir([]) == ""


def test_extract_takes_the_prefix_off_and_leaves_out_what_is_outside_it(tmp_path):
    tarball = tmp_path / "t.tar"
    with tarfile.open(tarball, "w") as tar:
        add_dir(tar, "top")
        add_file(tar, "top/setup.py", b"setup\n")
        add_file(tar, "top/sub/a.txt", b"a\n")
        add_file(tar, "other.txt", b"outside\n")
    with tarfile.open(tarball) as tar:
        src._extract_tar(tar, tmp_path / "a" / "b", "top/")
    got = sorted(str(p.relative_to(tmp_path / "a" / "b")) for p in (tmp_path / "a" / "b").rglob("*"))
    assert got == ["setup.py", "sub", "sub/a.txt"]
    assert (tmp_path / "a" / "b" / "sub" / "a.txt").read_bytes() == b"a\n"
    with tarfile.open(tarball) as tar:
        src._extract_tar(tar, tmp_path / "whole", "")
    assert (tmp_path / "whole" / "other.txt").read_bytes() == b"outside\n"
    assert (tmp_path / "whole" / "top" / "setup.py").read_bytes() == b"setup\n"


def test_file_sha256_reads_a_file_longer_than_one_block(tmp_path):
    data = bytes(range(256)) * 5000  # 1.28 MB: two blocks of 1 MiB
    (tmp_path / "f").write_bytes(data)
    assert src.file_sha256(tmp_path / "f") == hashlib.sha256(data).hexdigest()
    (tmp_path / "e").write_bytes(b"")
    assert src.file_sha256(tmp_path / "e") == hashlib.sha256(b"").hexdigest()


# ---- a URL ---------------------------------------------------------------------------------------------------------


def test_a_url_is_fetched_into_a_clone_named_by_the_urls_hash_and_kept(repo, tmp_path):
    path, commit = repo
    git(path, "tag", "25.05")
    url = f"file://{path}"
    clone = tmp_path / "cache" / (hashlib.sha256(url.encode()).hexdigest()[:16] + ".git")
    source = resolve({"url": url, "ref": "25.05", "commit": commit[:9]}, tmp_path / "cache")
    assert source.describe() == {
        "kind": "git-url", "location": url, "ref": "25.05", "commit": commit,
        "verified_by": f"{url} 25.05 resolved to it when fetched (clone kept in {clone})", "notes": []}
    assert source._git_dir == str(clone)
    assert git(tmp_path, "--git-dir", str(clone), "rev-parse", f"refs/amprepro/{commit}") == commit
    assert git(tmp_path, "--git-dir", str(clone), "rev-parse", "--is-bare-repository") == "true"
    assert source.read_text("setup.py") == (FAKE_APEX / "setup.py").read_text()
    assert source.read_text("nope") is None


def test_a_url_without_a_ref_fetches_the_commit_itself(repo, tmp_path):
    path, commit = repo
    git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
    source = resolve({"url": f"file://{path}", "commit": commit}, tmp_path / "cache")
    assert (source.ref, source.commit) == (commit, commit)


def test_a_url_already_in_the_clone_is_not_fetched_again(repo, tmp_path, monkeypatch):
    path, commit = repo
    spec = {"url": f"file://{path}", "ref": "HEAD", "commit": commit}
    resolve(spec, tmp_path / "cache")
    monkeypatch.setattr(src, "_fetch", lambda *args: pytest.fail("fetched again"))
    assert resolve(spec, tmp_path / "cache").commit == commit


def test_a_failed_fetch_says_gits_last_line_and_the_way_round(tmp_path):
    url = f"file://{tmp_path / 'none'}"
    message = raises(src._fetch, url, "25.05", OTHER, tmp_path / "clone.git")
    assert message.startswith(f"git could not fetch 25.05 from {url}: ")
    last = message.split(f"from {url}: ", 1)[1].split(". This machine")[0]
    assert last and last != "(no output)"
    assert message.endswith(
        ". This machine may not reach that host. Fix: get the source where the network allows and set "
        f"apex.source.path to an export made with `{src.EXPORT_HINT}`, or apex.source.tarball to `git archive` "
        "output with apex.source.sha256.")
    assert "\n" not in message
    assert (tmp_path / "clone.git" / "HEAD").is_file()  # the bare clone was made first


def test_a_fetch_at_another_commit_is_refused_whole(repo, tmp_path):
    path, commit = repo
    url = f"file://{path}"
    assert raises(src._fetch, url, "HEAD", OTHER, tmp_path / "clone.git") == (
        f"{url} at HEAD is commit {commit}, but apex.source.commit is {OTHER}: refusing to build. Fix: point the "
        f"source at commit {OTHER}, or set apex.source.commit to {commit} if that is the one you mean to build.")


def test_a_failed_fetch_without_output_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(src, "_run_git", lambda args, check=True, missing_ok=False: subprocess.CompletedProcess(
        args, 1, "", "  \n"))
    (tmp_path / "clone.git").mkdir()
    assert raises(src._fetch, "file:///x", "r", OTHER, tmp_path / "clone.git").startswith(
        "git could not fetch r from file:///x: (no output). This machine")


# ---- the helpers ---------------------------------------------------------------------------------------------------


def test_has_commit_is_false_without_the_clone_or_the_commit(repo, tmp_path):
    path, commit = repo
    assert src._has_commit(tmp_path / "none.git", commit) is False
    assert src._has_commit(path / ".git", commit) is True
    assert src._has_commit(path / ".git", OTHER) is False


def test_check_commit_compares_a_prefix_in_either_case():
    src._check_commit(OTHER, OTHER[:7].upper(), "here")
    src._check_commit(OTHER.upper(), OTHER[:7], "here")
    with pytest.raises(ApexError, match="^here is commit"):
        src._check_commit(OTHER, OTHER[1:8], "here")


def test_required_commit_is_lower_case():
    assert src._required_commit({"commit": "ABCDEF0"}, "w") == "abcdef0"


def test_rev_parse_and_a_failing_git_command_say_what_failed(repo, tmp_path):
    path, commit = repo
    assert src._rev_parse(str(path / ".git"), "HEAD") == commit
    message = raises(src._rev_parse, str(path / ".git"), "nosuchref")
    assert message.startswith(
        f"git --git-dir {path / '.git'} rev-parse --verify --end-of-options nosuchref failed: fatal: ")
    assert src._run_git(["--git-dir", str(path / ".git"), "rev-parse", "nosuchref"], check=False).returncode != 0


def test_without_git_the_source_says_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git on it
    assert src._run_git(["--version"], missing_ok=True) is None
    assert raises(src._run_git, ["--version"]) == (
        "git is not installed here but the apex source needs it: install git, or use apex.source.path with an "
        "export or apex.source.tarball.")
    (tmp_path / "plain").mkdir()
    assert src._checkout_git_dir(tmp_path / "plain") is None


def test_git_runs_with_only_the_safe_transports(monkeypatch):
    seen = []

    def run(args, **kwargs):
        seen.append((args, kwargs))
        return subprocess.CompletedProcess(args, 0, "out", "")

    monkeypatch.setattr(src.subprocess, "run", run)
    assert src._run_git(["status"]).stdout == "out"
    assert seen == [(["git", *src.GIT_PROTOCOLS, "status"], {"capture_output": True, "text": True})]


def test_a_source_of_an_unknown_kind_reads_and_copies_a_folder(tmp_path):
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "f.txt").write_text("f\n")
    source = Source("export", str(tmp_path / "tree"), None, OTHER, "by hand")
    assert source.read_text("f.txt") == "f\n"
    source.extract(tmp_path / "copy")
    assert (tmp_path / "copy" / "f.txt").read_text() == "f\n"
    assert Source("tarball", "t", "r", OTHER, "v", ["n"], "g", "p/").describe() == {
        "kind": "tarball", "location": "t", "ref": "r", "commit": OTHER, "verified_by": "v", "notes": ["n"]}


# ---- what the first mutation run showed (docs/mutation.md) ----------------------------------------------------------


def test_extract_of_a_commit_git_cannot_archive_raises(repo, tmp_path):
    path, _ = repo
    source = Source("git-checkout", str(path), None, OTHER, "v", _git_dir=str(path / ".git"))
    with pytest.raises(subprocess.CalledProcessError):
        source.extract(tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_an_export_with_a_submodule_is_checked_with_the_markers_gitlinks(repo, tmp_path):
    path, _ = repo
    git(path, "update-index", "--add", "--cacheinfo", f"160000,{OTHER},third_party/lib")
    git(path, "commit", "--quiet", "-m", "submodule")
    commit = git(path, "rev-parse", "HEAD")
    dest = tmp_path / "export"
    export(str(path / ".git"), "HEAD", dest)
    assert resolve({"path": str(dest), "commit": commit}, tmp_path / "git").commit == commit


def test_an_export_without_a_commit_is_refused_naming_the_path(repo, tmp_path):
    path, _ = repo
    dest = tmp_path / "export"
    export(str(path / ".git"), "HEAD", dest)
    assert raises(resolve, {"path": str(dest)}, tmp_path) == (
        f"apex.source.path {dest} is configured without apex.source.commit: pin the commit it must be (apex 25.05 is "
        "379937e1719b8190f38f3e666e2a8d32c97e221f).")


def test_a_tarball_member_that_would_land_outside_the_copy_is_refused(tmp_path):
    tarball = tmp_path / "t.tar"
    with tarfile.open(tarball, "w") as tar:
        add_file(tar, "top/setup.py")
        add_file(tar, "top/../../escaped.txt", b"outside\n")
    with tarfile.open(tarball) as tar, pytest.raises(tarfile.OutsideDestinationError):
        src._extract_tar(tar, tmp_path / "a" / "out", "top/")
    assert not (tmp_path / "escaped.txt").exists()
