"""What re-runs a job: the code digest (amprepro.codedigest), the views the cells read from apex and sanity
(amprepro.runinputs), and the rules that use them. The pipeline-level checks are in test_pipeline.py (smoke run)."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from amprepro import codedigest, runinputs
from amprepro.codedigest import PACKAGE_DIR, code_digest, stage_files

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "workflow" / "rules"


@pytest.fixture(autouse=True)
def fresh_trees(monkeypatch):
    """Every test parses what it digests: the process's trees are keyed by the bytes of a file, so a copy of the
    package written by an earlier test would be served from them (and hide a change to the parsing from the test)."""
    monkeypatch.setattr(codedigest, "_TREES", codedigest._Trees())
    codedigest._file_facts.cache_clear()
    yield
    codedigest._file_facts.cache_clear()


@pytest.fixture
def package(tmp_path) -> Path:
    copy = tmp_path / "amprepro"
    shutil.copytree(PACKAGE_DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{path.name} no longer has {old!r}"
    path.write_text(text.replace(old, new, 1))


def edit_a_class_docstring(path: Path) -> None:
    lines = path.read_text().splitlines(keepends=True)
    docstring = next(node.body[0].value for node in ast.walk(ast.parse("".join(lines)))
                     if isinstance(node, ast.ClassDef) and ast.get_docstring(node, clean=False) is not None)
    line = lines[docstring.lineno - 1]
    at = docstring.col_offset + 3  # after the opening quotes
    lines[docstring.lineno - 1] = line[:at] + "Edited class docstring. " + line[at:]
    path.write_text("".join(lines))


def edit_a_function_docstring(path: Path, kind=ast.FunctionDef) -> str:
    """Prefix the first docstring of a function (or method) of that kind; returns the function's name."""
    lines = path.read_text().splitlines(keepends=True)
    function = next(node for node in ast.walk(ast.parse("".join(lines)))
                    if isinstance(node, kind) and ast.get_docstring(node, clean=False) is not None)
    docstring = function.body[0].value
    line = lines[docstring.lineno - 1]
    at = docstring.col_offset + 3
    lines[docstring.lineno - 1] = line[:at] + "Edited function docstring. " + line[at:]
    path.write_text("".join(lines))
    return function.name


def test_a_function_docstring_edit_does_not_change_the_digest(package):
    before = code_digest("train.train", package_dir=package)
    assert edit_a_function_docstring(package / "train" / "train.py")
    assert edit_a_function_docstring(package / "train" / "measure.py")  # a method's (StepTimer) or a function's
    assert code_digest("train.train", package_dir=package) == before


def test_an_async_function_docstring_and_a_docstring_only_body_are_stripped(tmp_path):
    from amprepro.codedigest import source_tree

    first, second = tmp_path / "a.py", tmp_path / "b.py"
    first.write_text('async def f():\n    """One."""\n    return 1\n\ndef g():\n    """Only a docstring."""\n')
    second.write_text('async def f():\n    """Two."""\n    return 1\n\ndef g():\n    pass\n')
    assert source_tree(first) == source_tree(second)
    second.write_text('async def f():\n    """Two."""\n    return 2\n\ndef g():\n    pass\n')
    assert source_tree(first) != source_tree(second)


def test_comments_docstrings_and_layout_do_not_change_the_digest(package):
    before = code_digest("train.train", package_dir=package)
    train = package / "train" / "train.py"
    assert train.read_text().startswith('"""')
    edit(train, '"""', '"""Edited module docstring. ')
    edit(package / "train" / "data.py", "\n", "\n# a comment\n\n\n")
    edit(package / "train" / "models.py", "def build(", "# build one model\ndef build(")
    edit_a_class_docstring(package / "train" / "models.py")
    assert code_digest("train.train", package_dir=package) == before


@pytest.mark.parametrize("module", ["train/train.py", "train/data.py", "train/precision.py", "train/flops.py",
                                    "train/__init__.py"])
def test_a_statement_in_the_stage_or_a_module_it_imports_changes_the_digest(package, module):
    before = code_digest("train.train", package_dir=package)
    with open(package / module, "a") as handle:
        handle.write("\nUNUSED = 1\n")
    assert code_digest("train.train", package_dir=package) != before


def test_unrelated_modules_and_the_file_writer_do_not_count(package):
    before = code_digest("train.train", package_dir=package)
    # gpuslots counts now: the cell's launcher (amprepro.plan.launcher) reads its GPU listing
    for module in ("env/sanity.py", "analysis/summary.py", "files.py", "config/__init__.py", "env/launch.py",
                   "env/apexbuild/verify_probe.py", "report/__init__.py", "__init__.py"):
        with open(package / module, "a") as handle:
            handle.write("\nUNUSED = 1\n")
    assert code_digest("train.train", package_dir=package) == before


def test_an_imported_package_counts_whole():
    names = {str(path.relative_to(PACKAGE_DIR)) for path in stage_files(["env.apex_stage"])}
    assert {"env/apex_stage.py", "env/apexbuild/pipeline.py", "env/apexbuild/verify_probe.py"} <= names  # a script
    assert "files.py" not in names


def test_an_unknown_module_is_an_error():
    with pytest.raises(ValueError, match="amprepro.nosuch is not a module"):
        code_digest("nosuch")


def test_the_digest_says_what_it_is():
    assert re.fullmatch(r"code of amprepro\.report\.render, amprepro\.report\.reportlib: sha256 [0-9a-f]{64}",
                        code_digest("report.render", "report.reportlib"))


KEPT_DIGEST = """
import ast, sys
from pathlib import Path
from amprepro import codedigest
codedigest.keep_trees_in(Path(sys.argv[1]))
if sys.argv[3] == "no-parsing":
    ast.parse = None  # a tree that is not kept would fail here
print(codedigest.code_digest("train.train", "plan.launcher", package_dir=Path(sys.argv[2])))
"""


def kept_digest(trees: Path, package: Path, mode: str = "may-parse") -> str:
    """code_digest in a new process (a Snakemake's DAG build) that keeps its trees in `trees`."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", KEPT_DIGEST, str(trees), str(package), mode], capture_output=True,
                          text=True, timeout=60, env={"PYTHONPATH": str(REPO / "workflow")})
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.strip()


def test_kept_trees_give_the_same_digest_and_spare_the_next_process_the_parsing(package, tmp_path):
    trees = tmp_path / ".snakemake" / "amprepro" / "code-trees.json"
    fresh = code_digest("train.train", "plan.launcher", package_dir=package)
    assert kept_digest(trees, package) == fresh and trees.is_file()  # the first process parses and keeps
    assert kept_digest(trees, package, "no-parsing") == fresh  # the next parses nothing
    with open(package / "train" / "data.py", "a") as handle:  # an edit: that file is parsed again, and counts
        handle.write("\nUNUSED = 1\n")
    edited = code_digest("train.train", "plan.launcher", package_dir=package)
    assert edited != fresh and kept_digest(trees, package) == edited
    assert kept_digest(trees, package, "no-parsing") == edited
    kept = json.loads(trees.read_text())["files"]
    stage = stage_files(["train.train", "plan.launcher"], package)
    assert len(kept) == len({path.read_bytes() for path in stage})  # the old tree of data.py went


@pytest.mark.parametrize("damage", ["cut short", "another version", "not json"])
def test_a_damaged_or_foreign_tree_file_is_parsed_again_and_rewritten(package, tmp_path, damage):
    trees = tmp_path / "code-trees.json"
    fresh = code_digest("train.train", "plan.launcher", package_dir=package)
    kept_digest(trees, package)
    whole = json.loads(trees.read_text())
    version = whole["version"]
    if damage == "cut short":
        trees.write_text(trees.read_text()[: len(trees.read_text()) // 2])
    elif damage == "another version":  # trees written by another codedigest or Python: not what these bytes give
        whole["version"] = "other"
        whole["files"] = {key: [[], "Module([], [])"] for key in whole["files"]}
        trees.write_text(json.dumps(whole))
    else:
        trees.write_text("[1, 2")
    assert kept_digest(trees, package) == fresh
    assert json.loads(trees.read_text())["version"] == version
    assert kept_digest(trees, package, "no-parsing") == fresh  # rewritten whole


APEX_BUILT = {"status": "built", "required": True, "site_dir": "results/apex/site/abc", "has_amp": True,
              "commit": "379937e1", "reason": "apex 25.05 (379937e1) built in 171.3 s: 7/7 extensions importable",
              "stage_seconds": 171.3, "cache": {"key": "abc", "status": "built"}, "manifest": {"build_seconds": 160.0}}


def test_the_cells_apex_view_ignores_timings_and_cache_hits():
    again = {**APEX_BUILT, "reason": APEX_BUILT["reason"].replace("built in 171.3", "hit (results) in 4.2"),
             "stage_seconds": 4.2, "cache": {"key": "abc", "status": "hit (results)"}, "manifest": {}}
    assert runinputs.apex_for_runs(again) == runinputs.apex_for_runs(APEX_BUILT)
    for change in ({"commit": "25.09"}, {"site_dir": "results/apex/site/def"}, {"status": "skipped"},
                   {"has_amp": False}):
        assert runinputs.apex_for_runs({**APEX_BUILT, **change}) != runinputs.apex_for_runs(APEX_BUILT), change


def test_a_skipped_apex_keeps_its_reason_for_the_cells():
    skipped = {"status": "skipped", "required": False, "reason": "no CUDA GPU visible", "site_dir": None,
               "has_amp": False, "commit": None}
    assert runinputs.apex_for_runs(skipped)["reason"] == "no CUDA GPU visible"


def test_the_sanity_view_is_the_verdicts():
    record = {"checks": [{"name": "GPU name", "status": "pass", "detail": "NVIDIA H200, 140 GiB", "fix": ""},
                         {"name": "bf16", "status": "skip", "detail": "CPU", "fix": ""}], "passed": 1}
    details = {"checks": [{**record["checks"][0], "detail": "NVIDIA H200, 139 GiB"}, record["checks"][1]], "passed": 1}
    assert runinputs.sanity_verdicts(details) == runinputs.sanity_verdicts(record)
    verdict = {"checks": [record["checks"][0], {**record["checks"][1], "status": "pass"}], "passed": 2}
    assert runinputs.sanity_verdicts(verdict) != runinputs.sanity_verdicts(record)


def rule_blocks() -> dict[str, str]:
    blocks = {}
    for smk in RULES.glob("*.smk"):
        for match in re.finditer(r"^(?:rule|checkpoint) (\w+):\n((?:[ \t]+.*\n|\n)+)", smk.read_text(), re.M):
            blocks[match.group(1)] = match.group(2)
    return blocks


def test_every_rule_that_runs_amprepro_code_gates_on_its_digest_and_lists_no_module_as_input():
    checked = []
    for name, block in rule_blocks().items():
        inputs = block.split("output:")[0]
        assert "workflow/amprepro" not in inputs and "PKG" not in inputs, \
            f"rule {name} lists code as an input file (re-run by mtime); give it params code=code_digest(...)"
        modules = set(re.findall(r"-m amprepro\.([\w.]+)", block)) - {"gpuslots"}  # the GPU-slot wrapper
        if not modules or "output:" not in block:  # a rule without output runs whenever it is asked for
            continue
        digest = re.search(r"code=code_digest\(([^)]*)\)", block)
        assert digest, f"rule {name} runs {sorted(modules)} but has no params code=code_digest(...)"
        named = re.findall(r'"([\w.]+)"', digest.group(1))
        covered = {".".join(path.relative_to(PACKAGE_DIR).with_suffix("").parts) for path in stage_files(named)}
        assert modules <= covered, f"rule {name}: code_digest{tuple(named)} misses {sorted(modules - covered)}"
        checked.append(name)
    assert {"environment", "apex", "sanity", "train", "peak", "summary", "verify_compare", "report"} <= set(checked)


def test_the_cells_read_the_views_and_sanity_is_the_checkpoint_that_re_judges_them():
    blocks = rule_blocks()
    assert "unpack(train_inputs)" in blocks["train"]  # the views: tests/backbone/test_apex_overlap.py runs the DAG
    common = (RULES / "common.smk").read_text()
    # the view of the cell's apex build (amprepro.cellspec.APEX_VIEWS): the full build's, or the shell's (issue 38)
    from amprepro.cellspec import APEX_VIEWS

    assert ".apex_view" in common and 'inputs["apex"] = view' in common
    assert APEX_VIEWS == {"full": "results/apex/runs.json", "shell": "results/apex/shell-runs.json"}
    # each cell reads its own model's view of the memory plan, a checkpoint too
    plan_view = '"plan": f"results/plan/models/{wildcards.model}.json"'
    assert 'inputs = {"sanity": "results/sanity/verdicts.json", ' + plan_view + "}" in common
    assert re.search(r"^checkpoint plan:", (RULES / "plan.smk").read_text(), re.M)
    assert re.search(r"^checkpoint apex:", (RULES / "apex.smk").read_text(), re.M)
    assert re.search(r"^checkpoint apex_shell:", (RULES / "apex.smk").read_text(), re.M)
    assert "results/sanity/verdicts.json" in blocks["peak"] and "results/sanity/verdicts.json" in blocks["summary"]
    assert re.search(r"^checkpoint sanity:", (RULES / "sanity.smk").read_text(), re.M)
    assert "ancient(" not in "".join(blocks.values()), "ancient() inputs hide a job's own changes (sanity.smk)"


def test_a_template_edit_re_renders_the_report(tmp_path):
    """The report's HTML comes from Jinja2 templates: the report rule's digest reads them, byte for byte."""
    from amprepro.report import reporthtml

    workflow = tmp_path / "workflow"
    shutil.copytree(PACKAGE_DIR, workflow / "amprepro", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(reporthtml.TEMPLATE_DIR, workflow / "report" / "templates")
    block = rule_blocks()["report"]
    files = re.findall(r'"([\w/]+)"', re.search(r"files=\[([^]]*)\]", block).group(1))
    assert (PACKAGE_DIR.parent / files[0]).resolve() == reporthtml.TEMPLATE_DIR
    modules = re.findall(r'"([\w.]+)"', re.search(r"code=code_digest\(([^)]*)\)", block).group(1))
    before = code_digest(*modules, files=files, package_dir=workflow / "amprepro")
    assert code_digest(*modules, files=files, package_dir=PACKAGE_DIR) == before
    edit(workflow / "report" / "templates" / "verify.html.j2", "Out of tolerance:", "Outside the band:")
    assert code_digest(*modules, files=files, package_dir=workflow / "amprepro") != before
    with pytest.raises(ValueError, match="not a file or folder"):
        code_digest("report.render", files=["report/nosuch"], package_dir=workflow / "amprepro")


# --- amprepro.codedigest on a small package written here, every expected file list and digest worked out by hand ---

def small_package(root: Path) -> Path:
    """amprepro/ with a stage (top) that imports helper (inside a function), a module of a subpackage, the file
    writer and, through helper, other (which imports top again: a cycle); unrelated.py imported by nothing; sub/deep
    a package below a subpackage (counts whole)."""
    package = root / "amprepro"
    files = {
        "__init__.py": "",
        "files.py": "def write():\n    return 0\n",
        "top.py": ('"""The stage."""\nfrom amprepro import helper\nimport amprepro.sub.leaf\n'
                   "from amprepro import files\n"),
        "helper.py": "def f():\n    import amprepro.other\n    return 1\n",
        "other.py": "import amprepro.top\nY = 2\n",
        "unrelated.py": "Z = 3\n",
        "sub/__init__.py": "",
        "sub/leaf.py": "import amprepro.sub.deep.thing\n",
        "sub/deep/__init__.py": "",
        "sub/deep/thing.py": "T = 1\n",
        "sub/deep/script.py": "print(1)\n",
        "sub/deep/__pycache__/thing.cpython-311.pyc": "",
    }
    for name, text in files.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    return package


def test_module_paths_are_the_module_its_inits_or_a_whole_package_below_a_subpackage(tmp_path):
    from amprepro.codedigest import module_paths

    package = small_package(tmp_path)
    assert module_paths("top", package) == [package / "top.py"]
    assert module_paths("sub.leaf", package) == [package / "sub/__init__.py", package / "sub/leaf.py"]
    assert module_paths("sub", package) == [package / "sub/__init__.py"]
    whole = sorted([package / "sub/__init__.py", package / "sub/deep/__init__.py", package / "sub/deep/script.py",
                    package / "sub/deep/thing.py"])
    assert module_paths("sub.deep", package) == whole
    assert module_paths("sub.deep.thing", package) == whole
    assert module_paths("files", package) == [] and module_paths("files.write", package) == []
    with pytest.raises(ValueError) as error:
        module_paths("sub.nosuch", package)
    assert str(error.value) == f"amprepro.sub.nosuch is not a module of {package}"


def test_the_imports_of_a_file_are_the_package_modules_it_names_wherever_the_statement_is(tmp_path):
    from amprepro.codedigest import imported_modules

    path = tmp_path / "mod.py"
    path.write_text("import os\nimport amprepro\nimport amprepro.report.summary, json\n"
                    "from amprepro import files, nosuch\nfrom amprepro.train import models, NOT_A_MODULE\n"
                    "from . import relative\nfrom .train import data\nfrom amprepro_other import x\n"
                    "class C:\n    def f(self):\n        from amprepro.env import sanity\n")
    assert imported_modules(path) == {"report.summary", "files", "nosuch", "train", "train.models", "env",
                                      "env.sanity"}


def test_a_stage_is_its_modules_and_what_they_import_transitively(tmp_path):
    package = small_package(tmp_path)
    expected = sorted(package / name for name in ("top.py", "helper.py", "other.py", "sub/__init__.py",
                                                  "sub/leaf.py", "sub/deep/__init__.py", "sub/deep/script.py",
                                                  "sub/deep/thing.py"))
    assert stage_files(["top"], package) == expected  # no files.py, no unrelated.py, the cycle ends
    assert stage_files(["other", "unrelated"], package) == sorted([*expected, package / "unrelated.py"])
    assert stage_files([], package) == []


def test_the_digest_is_sha256_of_each_files_path_and_stripped_tree_then_the_data_files_bytes(tmp_path):
    import hashlib

    from amprepro.codedigest import source_tree

    package = small_package(tmp_path)
    templates = tmp_path / "report" / "templates"
    (templates / "__pycache__").mkdir(parents=True)
    (templates / "b.j2").write_text("B")
    (templates / "a.j2").write_text("A")
    (templates / "__pycache__" / "x.pyc").write_text("ignored")
    (tmp_path / "extra.txt").write_bytes(b"E\n")
    expected = hashlib.sha256()
    for path in stage_files(["sub.leaf"], package):
        expected.update(f"{path.relative_to(package)}\0{source_tree(path)}\0".encode())
    for name, data in (("report/templates/a.j2", b"A"), ("report/templates/b.j2", b"B"), ("extra.txt", b"E\n")):
        expected.update(f"{name}\0".encode() + data + b"\0")
    digest = code_digest("sub.leaf", files=["report/templates", "extra.txt"], package_dir=package)
    assert digest == ("code of amprepro.sub.leaf, report/templates, extra.txt: sha256 " + expected.hexdigest())
    # top and other import each other: the same files, the same hash; only the label names both
    assert code_digest("top", package_dir=package) == code_digest("other", "top", package_dir=package).replace(
        "amprepro.other, ", "")
    (templates / "__pycache__" / "x.pyc").write_text("changed")
    assert code_digest("sub.leaf", files=["report/templates", "extra.txt"], package_dir=package) == digest
    (templates / "a.j2").write_text("A2")
    assert code_digest("sub.leaf", files=["report/templates", "extra.txt"], package_dir=package) != digest
    with pytest.raises(ValueError) as error:
        code_digest("top", files=["nosuch"], package_dir=package)
    assert str(error.value) == f"nosuch is not a file or folder of {tmp_path}"


def test_the_stripped_tree_drops_only_the_first_string_of_a_body(tmp_path):
    from amprepro.codedigest import has_docstring, parse, source_tree

    def tree(text):
        path = tmp_path / f"t{len(list(tmp_path.iterdir()))}.py"
        path.write_text(text)
        return source_tree(path)

    plain = tree("class K:\n    def m(self):\n        return 1\n")
    assert tree('"""Module."""\nclass K:\n    """Class."""\n    def m(self):\n        """Method."""\n        return 1\n'
                ) == plain
    assert tree("\n\n# moved down two lines\nclass K:\n    def m(self):  # same\n        return 1\n") == plain
    assert tree("class K:\n    def m(self):\n        return 2\n") != plain
    # a second string is code (an expression statement), a number first is no docstring
    assert tree('def f():\n    """Doc."""\n    "kept"\n') != tree('def f():\n    """Doc."""\n')
    assert tree("def f():\n    1\n    return 1\n") != tree("def f():\n    return 1\n")
    assert tree('def f():\n    """Only."""\n') == tree("def f():\n    pass\n")
    assert tree('"""Only a docstring."""\n') == tree("pass\n")
    assert has_docstring(ast.parse('"""x"""')) and not has_docstring(ast.parse("x = 1"))
    assert not has_docstring(ast.parse("")) and not has_docstring(ast.parse("b'bytes'"))
    assert isinstance(parse(tmp_path / "t0.py"), ast.Module)


def test_an_edited_file_is_parsed_again(tmp_path):
    from amprepro.codedigest import imported_modules, source_tree

    path = tmp_path / "m.py"
    path.write_text("X = 1\n")
    before = source_tree(path)
    assert imported_modules(path) == set()
    path.write_text("import amprepro.files\nX = 10\n")
    assert source_tree(path) != before and imported_modules(path) == {"files"}


def test_a_file_named_before_a_folder_is_kept(tmp_path):
    from amprepro.codedigest import data_files

    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "a.j2").write_text("A")
    (tmp_path / "first.txt").write_text("F")
    assert data_files(["first.txt", "folder"], tmp_path) == [tmp_path / "first.txt", tmp_path / "folder" / "a.j2"]


def test_a_syntax_error_names_the_file(tmp_path):
    from amprepro.codedigest import parse

    path = tmp_path / "broken.py"
    path.write_text("def f(:\n")
    with pytest.raises(SyntaxError) as error:
        parse(path)
    assert error.value.filename == str(path)


# ---- the kept trees, in this process ----------------------------------------------------------------------------


def test_the_trees_remember_what_was_put_and_what_was_used():
    trees = codedigest._Trees()
    assert (trees.entries, trees.used, trees.file, trees.changed) == ({}, set(), None, False)
    assert trees.get("a") is None and trees.used == set()
    assert trees.put("a", [["amprepro.x"]], "Module()") == ([["amprepro.x"]], "Module()")
    assert trees.entries == {"a": [[["amprepro.x"]], "Module()"]} and trees.used == {"a"} and trees.changed
    trees.used.clear()
    assert trees.get("a") == ([["amprepro.x"]], "Module()") and trees.used == {"a"}


@pytest.mark.parametrize("text", [None, "[1, 2", '["a list"]', '{"version": "other", "files": {"k": [[], "d"]}}',
                                  '{"version": "VERSION", "files": ["k"]}'])
def test_a_missing_damaged_or_foreign_tree_file_loads_nothing(tmp_path, text):
    file = tmp_path / "trees.json"
    if text is not None:
        file.write_text(text.replace("VERSION", codedigest._version()))
    trees = codedigest._Trees()
    trees.put("own", [], "mine")
    trees.load(file)
    assert trees.file == file and trees.entries == {"own": [[], "mine"]}


def test_a_kept_file_is_merged_under_this_processes_own_trees_and_saved_with_the_used_ones_only(tmp_path, monkeypatch):
    file = tmp_path / "deep" / "er" / "trees.json"  # folders made as needed
    replaced = []
    real_replace = codedigest.os.replace

    def replace(source, target):
        replaced.append((Path(source), Path(target)))
        real_replace(source, target)

    monkeypatch.setattr(codedigest.os, "replace", replace)
    trees = codedigest._Trees()
    trees.save()  # no file named: nothing written, no error
    trees.file = file
    trees.save()  # nothing new: nothing written
    assert not file.parent.exists()
    trees.put("b", [["amprepro.b"]], "B")
    trees.put("a", [], "A")
    trees.save()
    assert json.loads(file.read_text()) == {"version": codedigest._version(),
                                            "files": {"a": [[], "A"], "b": [[["amprepro.b"]], "B"]}}
    assert list(json.loads(file.read_text())["files"]) == ["a", "b"] and trees.changed is False
    assert [p.name for p in file.parent.iterdir()] == ["trees.json"]  # the temporary file was renamed
    (source, target), = replaced  # written beside the file (one filesystem: the rename is atomic), then renamed
    assert target == file and source.parent == file.parent and source.name.startswith(".trees.json.")
    later = codedigest._Trees()
    later.put("a", [], "A, parsed again here")
    later.load(file)
    assert later.entries == {"a": [[], "A, parsed again here"], "b": [[["amprepro.b"]], "B"]}
    assert later.get("b") == ([["amprepro.b"]], "B")
    later.save()  # the used ones: a (put) and b (got); c, never used, would go
    assert json.loads(file.read_text())["files"] == {"a": [[], "A, parsed again here"], "b": [[["amprepro.b"]], "B"]}


def test_saving_where_it_cannot_write_is_no_error(tmp_path):
    (tmp_path / "a-file").write_text("")
    trees = codedigest._Trees()
    trees.file = tmp_path / "a-file" / "trees.json"  # its folder is a file
    trees.put("a", [], "A")
    trees.save()
    assert trees.changed  # not written, so still to write


def test_keep_trees_in_loads_the_file_and_saves_at_exit_once(tmp_path, monkeypatch):
    registered = []
    monkeypatch.setattr(codedigest.atexit, "register", registered.append)
    first, second = tmp_path / "one.json", tmp_path / "two.json"
    second.write_text(json.dumps({"version": codedigest._version(), "files": {"k": [[], "K"]}}))
    codedigest.keep_trees_in(first)
    assert registered == [codedigest._TREES.save] and codedigest._TREES.file == first
    codedigest.keep_trees_in(str(second))
    assert len(registered) == 1 and codedigest._TREES.file == second and codedigest._TREES.get("k") == ([], "K")


def test_a_kept_tree_stands_for_the_parse_of_the_same_bytes(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("from amprepro.train import models\n")
    key = codedigest.hashlib.sha256(module.read_bytes()).hexdigest()
    codedigest._TREES.put(key, [["amprepro.report"]], "a tree kept by an earlier process")
    assert codedigest.source_tree(module) == "a tree kept by an earlier process"
    assert codedigest.imported_modules(module) == {"report"}
    module.write_text("from amprepro.train import models  # edited\n")  # other bytes: parsed
    assert codedigest.imported_modules(module) == {"train", "train.models"}
    assert codedigest._TREES.changed and len(codedigest._TREES.entries) == 2


def test_the_trees_version_names_this_module_and_the_python():
    own = codedigest.hashlib.sha256(Path(codedigest.__file__).read_bytes()).hexdigest()
    assert codedigest._version() == f"{own} python {codedigest.sys.version_info.major}." \
                                    f"{codedigest.sys.version_info.minor}"


def built_records(apex: Path, entry: str, site: str) -> None:
    for name in ("build.json", "apex.json", "runs.json"):
        (apex / name).write_text(json.dumps({"status": "built", "entry": entry, "site_dir": site}))


def test_apex_records_that_name_a_build_that_is_gone_are_removed_and_a_dry_run_only_says_so(tmp_path):
    """amprepro.env.apexrecords: results/apex/build/<key>/ or results/apex/site/<key>/ deleted by hand while the
    records stay (issue 41: the apex cells then failed with ModuleNotFoundError)."""
    from amprepro.env import apexrecords
    from amprepro.env.apexbuild import install

    assert apexrecords.STAMP == install.STAMP
    apex = tmp_path / "results/apex"
    entry, site = apex / "build/abc", apex / "site/abc"
    entry.mkdir(parents=True)
    site.mkdir(parents=True)
    (entry / "manifest.json").write_text(json.dumps({"wheel": {"file": "apex-0-cp311.whl"}}))
    (entry / "apex-0-cp311.whl").write_bytes(b"wheel")
    (site / apexrecords.STAMP).write_text("sha\n")
    built_records(apex, "results/apex/build/abc", str(site))  # relative to the working directory, or absolute
    assert apexrecords.recover(apex, tmp_path, dry_run=False) is None
    (entry / "apex-0-cp311.whl").unlink()
    assert apexrecords.missing(apex, tmp_path) == ["results/apex/build/abc (named by build.json and apex.json and "
                                                   "runs.json)"]
    (entry / "manifest.json").unlink()
    (site / apexrecords.STAMP).unlink()
    said = apexrecords.recover(apex, tmp_path, dry_run=True)
    assert said.startswith(f"the apex records in {apex} name what is gone: results/apex/build/abc (named by")
    assert f"; {site} (named by build.json and apex.json and runs.json). A run (not a dry run)" in said
    assert sorted(path.name for path in apex.glob("*.json")) == ["apex.json", "build.json", "runs.json"]
    said = apexrecords.recover(apex, tmp_path, dry_run=False)
    assert said.endswith("Removed build.json, apex.json, runs.json: this run builds apex again (or takes it from the "
                         "build cache) and installs it before the apex cells.")
    assert not list(apex.glob("*.json"))
    for status in ("skipped", "failed"):  # nothing was built: nothing to miss
        (apex / "apex.json").write_text(json.dumps({"status": status, "site_dir": None, "reason": "no GPU"}))
        assert apexrecords.missing(apex, tmp_path) == []
    (apex / "apex.json").write_text("{not json")
    assert apexrecords.missing(apex, tmp_path) == []
