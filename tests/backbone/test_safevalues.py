"""amprepro.safevalues: which config values may reach git or a path, each check at its edges, and the exact message a
refused value gets (docs/mutation.md: these tests are what kills the module's mutants)."""

from __future__ import annotations

import pytest

from amprepro import safevalues
from amprepro.safevalues import apex_problems, commit_problem, git_ref_problem, git_url_problem, path_problem, shorten

URL_PROBLEM = ("is not an https://, ssh:// or file:// URL or user@host:path (other git transports, such as ext::, "
               "can run commands, and a value starting with '-' would be read as an option)")
REF_PROBLEM = ("is not a tag, branch or commit name (letters, digits and . _ / + -, not starting with '-', '.' or "
               "'/', no '..', at most 200 characters)")
COMMIT_PROBLEM = "is not a commit id (7 to 40 lower-case hex digits)"


@pytest.mark.parametrize("url", [
    "https://github.com/NVIDIA/apex", "ssh://git@github.com/NVIDIA/apex.git", "file:///srv/git/apex",
    "git@github.com:NVIDIA/apex.git", "a.b_c-d@h0st.example-1:path", "https://x",
])
def test_the_urls_git_may_fetch_pass(url):
    assert git_url_problem(url) is None


@pytest.mark.parametrize("url", [
    "ext::sh -c touch% /tmp/pwned", "http://github.com/NVIDIA/apex", "ftp://host/apex", "https://",
    "https://-oProxyCommand=x", "https://host/a b", "https://host/apex\n", "--upload-pack=touch /tmp/x",
    "git@-host:apex", "git@.host:apex", "@host:apex", "git@host:", "git@host:-x", "Https://host/apex",
    " https://host/apex", "github.com/NVIDIA/apex", "", None, 42, ["https://host/apex"],
])
def test_other_transports_options_and_non_strings_are_refused_with_the_reason(url):
    assert git_url_problem(url) == URL_PROBLEM


@pytest.mark.parametrize("ref", [
    "25.05", "master", "refs/tags/25.05", "release/v1+cu12", "a", "a" * 200, "379937e1719b8190f38f3e666e2a8d32c97e221f",
    "a.b", "a/b", "a-b", "x.lockx", "lock", "a.lo/ck",
])
def test_tags_branches_and_commits_pass(ref):
    assert git_ref_problem(ref) is None


@pytest.mark.parametrize("ref", [
    "-b", ".hidden", "/abs", "a..b", "a//b", "a/.b", "x.lock", "x.lock/y", "a.", "a/", "a" * 201, "", "a b",
    "a\nb", "a~1", "a^", "a:b", "HEAD@{1}", "a*", None, 7,
])
def test_what_git_would_read_otherwise_is_refused_with_the_reason(ref):
    assert git_ref_problem(ref) == REF_PROBLEM


@pytest.mark.parametrize("commit", ["379937e", "0" * 40, "379937e1719b8190f38f3e666e2a8d32c97e221f", "abcdef0123"])
def test_commit_ids_of_7_to_40_lower_case_hex_digits_pass(commit):
    assert commit_problem(commit) is None


@pytest.mark.parametrize("commit", ["379937", "0" * 41, "379937E", "379937g", "-379937e", " 379937e", "379937e\n",
                                    "", None, 3799370])
def test_anything_else_is_not_a_commit_id(commit):
    assert commit_problem(commit) == COMMIT_PROBLEM


@pytest.mark.parametrize("path", ["apex", "./-apex", "/srv/apex src", "a" * safevalues.MAX_PATH, "~/apex", "é"])
def test_paths_pass(path):
    assert path_problem(path) is None


@pytest.mark.parametrize(("path", "problem"), [
    ("", "is not a path"),
    (None, "is not a path"),
    (5, "is not a path"),
    ("-apex", "starts with '-' (it would be read as an option); prefix it with ./"),
    ("apex\nsrc", "contains a control character (newline, tab, NUL ...)"),
    ("apex\x00", "contains a control character (newline, tab, NUL ...)"),
    ("\x1fapex", "contains a control character (newline, tab, NUL ...)"),
    ("a\tb", "contains a control character (newline, tab, NUL ...)"),
    ("a" * 4097, "is 4097 characters long (at most 4096)"),
])
def test_paths_that_are_no_path_an_option_a_control_character_or_too_long_are_refused(path, problem):
    assert path_problem(path) == problem


def test_the_first_printable_character_and_the_longest_path_are_the_edges():
    assert path_problem("a b") is None  # chr(32), the first character that is not a control character
    assert path_problem("a\x7f") is None  # DEL is not below 32
    assert safevalues.MAX_PATH == 4096
    assert path_problem("/" + "a" * 4095) is None
    assert path_problem("/" + "a" * 4096) == "is 4097 characters long (at most 4096)"


def test_a_leading_dash_is_named_before_a_control_character_and_a_control_character_before_the_length():
    assert path_problem("-a\n") == "starts with '-' (it would be read as an option); prefix it with ./"
    assert path_problem("a\n" * 3000) == "contains a control character (newline, tab, NUL ...)"


def test_the_path_fields_are_the_source_path_the_tarball_and_the_cache():
    assert safevalues.APEX_PATH_FIELDS == (("source", "path"), ("source", "tarball"), ("cache_dir",))


def test_every_apex_field_is_checked_and_named_with_its_value():
    apex = {"source": {"url": "ext::sh", "ref": "-b", "commit": "XYZ", "path": "-p", "tarball": "t\n"},
            "cache_dir": "-c"}
    assert apex_problems(apex) == [
        ("source.url", f"'ext::sh' {URL_PROBLEM}"),
        ("source.ref", f"'-b' {REF_PROBLEM}"),
        ("source.commit", f"'XYZ' {COMMIT_PROBLEM}"),
        ("source.path", "'-p' starts with '-' (it would be read as an option); prefix it with ./"),
        ("source.tarball", "'t\\n' contains a control character (newline, tab, NUL ...)"),
        ("cache_dir", "'-c' starts with '-' (it would be read as an option); prefix it with ./"),
    ]


def test_good_and_unset_apex_values_have_no_problem():
    assert apex_problems({}) == []
    assert apex_problems({"source": None, "cache_dir": None}) == []
    good = {"source": {"url": "https://github.com/NVIDIA/apex", "ref": "25.05", "commit": "379937e",
                       "path": "vendor/apex", "tarball": "apex.tar.gz", "sha256": "-not-checked-here"},
            "cache_dir": "/scratch/apex"}
    assert apex_problems(good) == []


def test_a_source_field_is_read_under_source_and_the_cache_dir_beside_it():
    # cache_dir under source, or path beside it, is not where the config puts them: not read
    assert apex_problems({"source": {"cache_dir": "-c"}, "path": "-p", "url": "ext::"}) == []
    assert apex_problems({"cache_dir": "-c"}) == [
        ("cache_dir", "'-c' starts with '-' (it would be read as an option); prefix it with ./")]
    assert apex_problems({"source": {"tarball": "-t"}}) == [
        ("source.tarball", "'-t' starts with '-' (it would be read as an option); prefix it with ./")]


def test_a_value_that_is_set_but_empty_or_not_a_string_is_checked():
    assert apex_problems({"source": {"path": "", "commit": 12}}) == [
        ("source.commit", f"12 {COMMIT_PROBLEM}"), ("source.path", "'' is not a path")]


def test_shorten_keeps_a_value_of_200_characters_and_cuts_a_longer_one():
    assert shorten("abc") == "'abc'"
    assert shorten(7) == "7"
    exact = "a" * 198  # its repr is 200 characters
    assert shorten(exact) == repr(exact)
    longer = "a" * 199  # 201 with the quotes
    assert shorten(longer) == f"'{'a' * 199}... (201 characters)"
    assert shorten("abcdef", limit=4) == "'abc... (8 characters)"
    assert shorten("ab", limit=4) == "'ab'"


def test_a_long_refused_value_is_shortened_in_its_message():
    [(field, problem)] = apex_problems({"source": {"url": "ext::" + "x" * 300}})
    assert field == "source.url"
    assert problem == f"'ext::{'x' * 194}... (307 characters) {URL_PROBLEM}"
