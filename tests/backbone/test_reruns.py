"""What re-runs a job: the code digest (amprepro.codedigest), the views the cells read from apex and sanity
(amprepro.runinputs), and the rules that use them. The pipeline-level checks are in test_pipeline.py (smoke run)."""

from __future__ import annotations

import ast
import json
import re
import shutil
from pathlib import Path

import pytest

from amprepro import runinputs
from amprepro.codedigest import PACKAGE_DIR, code_digest, stage_files

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "workflow" / "rules"


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
    for module in ("env/sanity.py", "report/summary.py", "files.py", "config.py", "env/launch.py",
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
        modules = set(re.findall(r"-m amprepro\.([\w.]+)", block)) - {"env.gpuslots"}  # the GPU-slot wrapper
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
    assert 'inputs["apex"] = "results/apex/runs.json"' in common
    # each cell reads its own model's view of the memory plan, a checkpoint too
    plan_view = '"plan": f"results/plan/models/{wildcards.model}.json"'
    assert 'inputs = {"sanity": "results/sanity/verdicts.json", ' + plan_view + "}" in common
    assert re.search(r"^checkpoint plan:", (RULES / "plan.smk").read_text(), re.M)
    assert re.search(r"^checkpoint apex:", (RULES / "apex.smk").read_text(), re.M)
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
