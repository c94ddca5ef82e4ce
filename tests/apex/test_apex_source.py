"""Source pinning: every kind of source proves its commit or the build is refused, with the reason."""

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
from amprepro.env.apexbuild import source as source_module
from amprepro.env.apexbuild.source import export, export_marker, resolve
from amprepro.env.apexbuild.treehash import tree_hash
from amprepro.safevalues import git_ref_problem, git_url_problem

OTHER_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "apex"
    return path, make_repo(FAKE_APEX, path)


def sha256(path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def git_archive(repo_path, dest, prefix=""):
    subprocess.run(["git", "archive", "--format=tar.gz", f"--prefix={prefix}", "-o", str(dest), "HEAD"],
                   cwd=repo_path, check=True)
    return dest


def test_checkout_at_the_pinned_commit_resolves_to_the_full_sha(repo, tmp_path):
    path, commit = repo
    source = resolve({"path": str(path), "commit": commit[:8]}, tmp_path / "git")
    assert (source.kind, source.commit) == ("git-checkout", commit)
    assert "setup.py received" in source.read_text("setup.py")


def test_checkout_at_another_commit_is_refused(repo, tmp_path):
    path, commit = repo
    with pytest.raises(ApexError, match=f"is commit {commit}, but apex.source.commit is {OTHER_COMMIT[:10]}"):
        resolve({"path": str(path), "commit": OTHER_COMMIT[:10]}, tmp_path / "git")


def test_uncommitted_edits_are_ignored_and_said_so(repo, tmp_path):
    path, commit = repo
    (path / "setup.py").write_text("# edited\n")
    source = resolve({"path": str(path), "commit": commit}, tmp_path / "git")
    assert any("uncommitted changes" in note for note in source.notes)
    source.extract(tmp_path / "copy")
    assert "setup.py received" in (tmp_path / "copy" / "setup.py").read_text()


def test_a_path_needs_a_pinned_commit(repo, tmp_path):
    path, _ = repo
    with pytest.raises(ApexError, match="without apex.source.commit"):
        resolve({"path": str(path)}, tmp_path / "git")


def test_export_with_marker_is_checked_by_tree_hash(repo, tmp_path):
    path, commit = repo
    dest = tmp_path / "vendor" / "apex-export"
    export(str(path / ".git"), "HEAD", dest)
    source = resolve({"path": str(dest), "commit": commit[:12]}, tmp_path / "git")
    assert (source.kind, source.commit) == ("export", commit)
    assert git(path, "rev-parse", "HEAD^{tree}") in source.verified_by


def test_an_edited_export_is_refused(repo, tmp_path):
    path, commit = repo
    dest = tmp_path / "apex-export"
    export(str(path / ".git"), "HEAD", dest)
    (dest / "ext_src" / "version.cpp").write_text("// changed\n")
    with pytest.raises(ApexError, match="does not hold the files of commit"):
        resolve({"path": str(dest), "commit": commit}, tmp_path / "git")


def test_an_export_at_another_commit_is_refused(repo, tmp_path):
    path, _ = repo
    dest = tmp_path / "apex-export"
    export(str(path / ".git"), "HEAD", dest)
    with pytest.raises(ApexError, match="refusing to build"):
        resolve({"path": str(dest), "commit": OTHER_COMMIT}, tmp_path / "git")


def test_a_plain_directory_without_marker_is_refused(tmp_path):
    plain = tmp_path / "apex-copy"
    plain.mkdir()
    with pytest.raises(ApexError, match="neither a git checkout nor an export"):
        resolve({"path": str(plain), "commit": OTHER_COMMIT}, tmp_path / "git")


def test_an_export_inside_another_repository_is_still_an_export(repo, tmp_path):
    """vendor/ of this project is inside its git repo; HEAD of that repo must not be taken for apex's."""
    path, commit = repo
    outer = tmp_path / "project"
    outer.mkdir()
    git(outer, "init", "--quiet")
    export(str(path / ".git"), "HEAD", outer / "vendor" / "apex")
    assert resolve({"path": str(outer / "vendor" / "apex"), "commit": commit}, tmp_path / "git").kind == "export"


def test_tree_hash_matches_git_for_modes_symlinks_empty_dirs_and_submodules(tmp_path):
    work = tmp_path / "work"
    (work / "sub" / "deeper").mkdir(parents=True)
    (work / "run.sh").write_text("#!/bin/sh\n")
    (work / "run.sh").chmod(0o755)
    (work / "sub" / "deeper" / "a.txt").write_text("a\n")
    (work / "sub-file").write_text("sorts before sub/ in git\n")
    os.symlink("sub/deeper/a.txt", work / "link")
    git(work, "init", "--quiet")
    git(work, "add", "-A")
    git(work, "update-index", "--add", "--cacheinfo", f"160000,{OTHER_COMMIT},third_party/lib")
    git(work, "commit", "--quiet", "-m", "tree")
    dest = tmp_path / "exported"
    record = export(str(work / ".git"), "HEAD", dest)  # export() itself re-checks the hash
    (dest / "empty-dir").mkdir()
    assert record["gitlinks"] == {"third_party/lib": OTHER_COMMIT}
    assert tree_hash(dest, record["gitlinks"]) == git(work, "rev-parse", "HEAD^{tree}")
    assert json.loads(export_marker(dest).read_text())["tree"] == record["tree"]


def test_tarball_from_git_archive_carries_its_commit(repo, tmp_path):
    path, commit = repo
    tarball = git_archive(path, tmp_path / "apex.tar.gz", prefix="apex-fixture/")
    source = resolve({"tarball": str(tarball), "sha256": sha256(tarball), "commit": commit[:7]}, tmp_path / "git")
    assert (source.kind, source.commit) == ("tarball", commit)
    source.extract(tmp_path / "out")
    assert (tmp_path / "out" / "setup.py").is_file()


def test_tarball_with_wrong_checksum_is_refused(repo, tmp_path):
    path, commit = repo
    tarball = git_archive(path, tmp_path / "apex.tar.gz")
    with pytest.raises(ApexError, match="has sha256 .* but apex.source.sha256 is 0000"):
        resolve({"tarball": str(tarball), "sha256": "0" * 64, "commit": commit}, tmp_path / "git")


def test_tarball_without_checksum_is_refused(repo, tmp_path):
    path, commit = repo
    tarball = git_archive(path, tmp_path / "apex.tar.gz")
    with pytest.raises(ApexError, match="has no apex.source.sha256"):
        resolve({"tarball": str(tarball), "commit": commit}, tmp_path / "git")


def test_tarball_of_another_commit_is_refused(repo, tmp_path):
    path, _ = repo
    tarball = git_archive(path, tmp_path / "apex.tar.gz")
    with pytest.raises(ApexError, match="commit id written by git archive"):
        resolve({"tarball": str(tarball), "sha256": sha256(tarball), "commit": OTHER_COMMIT}, tmp_path / "git")


def test_tarball_without_commit_id_needs_the_full_sha(tmp_path):
    tarball = tmp_path / "plain.tar"
    with tarfile.open(tarball, "w") as tar:
        data = b"print('setup')\n"
        info = tarfile.TarInfo("setup.py")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    spec = {"tarball": str(tarball), "sha256": sha256(tarball)}
    with pytest.raises(ApexError, match="carries no commit id"):
        resolve({**spec, "commit": OTHER_COMMIT[:8]}, tmp_path / "git")
    assert resolve({**spec, "commit": OTHER_COMMIT}, tmp_path / "git").commit == OTHER_COMMIT


def test_url_and_ref_are_fetched_once_and_checked(repo, tmp_path):
    path, commit = repo
    git(path, "tag", "25.05")
    spec = {"url": f"file://{path}", "ref": "25.05", "commit": commit[:9]}
    source = resolve(spec, tmp_path / "git")
    assert (source.kind, source.commit) == ("git-url", commit)
    (path / ".git").rename(path / "gone")  # the remote disappears: the kept clone must suffice
    assert resolve(spec, tmp_path / "git").commit == commit
    source.extract(tmp_path / "out")
    assert (tmp_path / "out" / "ext_src" / "flatten_unflatten.cpp").is_file()


def test_url_ref_at_another_commit_is_refused(repo, tmp_path):
    path, _ = repo
    git(path, "tag", "25.05")
    with pytest.raises(ApexError, match="at 25.05 is commit .* but apex.source.commit is"):
        resolve({"url": f"file://{path}", "ref": "25.05", "commit": OTHER_COMMIT}, tmp_path / "git")


def test_unreachable_url_suggests_path_or_tarball(tmp_path):
    spec = {"url": "https://127.0.0.1:9/NVIDIA/apex.git", "ref": "25.05", "commit": OTHER_COMMIT}
    with pytest.raises(ApexError, match="could not fetch 25.05 .*apex.source.path.*apex.source.tarball"):
        resolve(spec, tmp_path / "git")


def test_path_and_tarball_together_are_ambiguous(tmp_path):
    with pytest.raises(ApexError, match="both path and tarball"):
        resolve({"path": "a", "tarball": "b"}, tmp_path / "git")


def test_no_source_at_all(tmp_path):
    with pytest.raises(ApexError, match="No apex source is configured"):
        resolve({"url": None, "path": None, "tarball": None}, tmp_path / "git")


INJECTIONS = [
    ("ref", "--upload-pack=touch {marker};git-upload-pack"),
    ("url", "--upload-pack=touch {marker};git-upload-pack"),
    ("url", "ext::sh -c touch% {marker}"),
]


@pytest.mark.parametrize("field, value", INJECTIONS)
def test_a_source_value_never_runs_a_command(repo, tmp_path, field, value):
    path, commit = repo
    marker = tmp_path / "marker"
    spec = {"url": f"file://{path}", "ref": "HEAD", "commit": commit[:8], field: value.format(marker=marker)}
    with pytest.raises(ApexError, match=f"apex.source.{field} .* is not"):
        resolve(spec, tmp_path / "git")
    assert not marker.exists()


@pytest.mark.parametrize("field, value", INJECTIONS)
def test_git_itself_is_called_so_that_no_value_runs_a_command(repo, tmp_path, field, value):
    """Behind the pattern check: `--` before the positionals, and protocol.allow=never but for https, ssh, file."""
    path, commit = repo
    marker = tmp_path / "marker"
    args = {"url": f"file://{path}", "ref": "HEAD", field: value.format(marker=marker)}
    with pytest.raises(ApexError, match="could not fetch"):
        source_module._fetch(args["url"], args["ref"], commit, tmp_path / "clone.git")
    assert not marker.exists()


@pytest.mark.parametrize("ref", ["25.05", "master", "release/25.05", "refs/tags/v1.0", "379937e1", "v1.0+cu13"])
def test_plain_refs_pass_the_pattern(ref):
    assert git_ref_problem(ref) is None


@pytest.mark.parametrize("ref", ["-x", "a..b", "a b", ".hidden", "x.lock", "a//b", "x/", "25.05\n", "a@{1}", ""])
def test_refs_git_would_read_otherwise_are_refused(ref):
    assert git_ref_problem(ref) is not None


@pytest.mark.parametrize("url", ["https://github.com/NVIDIA/apex.git", "ssh://git@github.com/NVIDIA/apex.git",
                                 "file:///srv/apex", "git@github.com:NVIDIA/apex.git"])
def test_https_ssh_file_and_scp_like_urls_pass(url):
    assert git_url_problem(url) is None


@pytest.mark.parametrize("url", ["http://example.com/apex.git", "ext::sh -c id", "fd::3", "/srv/apex", "-u",
                                 "ssh://-oProxyCommand=id/x", "https://host/a b", "https://host/x\n", "git@host:-x"])
def test_other_urls_are_refused(url):
    assert git_url_problem(url) is not None


def test_export_refuses_a_ref_that_looks_like_an_option(repo, tmp_path):
    path, _ = repo
    with pytest.raises(ApexError, match="--ref .* is not a tag"):
        export(str(path / ".git"), "--output=x", tmp_path / "out")
    assert not (tmp_path / "out").exists()
