"""mutmut 3.8 for a package that lives below workflow/ (amprepro imports as `amprepro`, from workflow/amprepro).

mutmut names each mutant after its file's path with only a leading `src/` taken off, so
workflow/amprepro/config/schema.py would be `workflow.amprepro.config.schema`, while the tests import it (and mutmut's
trampolines record it) as `amprepro.config.schema`: mutmut then stops ("tests recorded trampoline hits but none match
any mutant key"). This takes a leading `workflow/` off as well, and otherwise runs mutmut's own command line unchanged:

    .venv/bin/python tools/mutation/mutmut_workflow.py run --max-children 2

MUTATION_TESTS (test files or node ids, separated by spaces), where set, replaces `pytest_add_cli_args_test_selection`
for this run: one module's mutants are then tried against only the tests that are about it, and mutmut's first pass
(every selected test once, to map tests to functions) takes seconds instead of minutes:

    MUTATION_TESTS="tests/backbone/test_safevalues.py" .venv/bin/python tools/mutation/mutmut_workflow.py run \
        --max-children 2 "amprepro.safevalues*"
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import mutmut.configuration as configuration
import mutmut.utils.format_utils as format_utils

_mutant_name = format_utils.get_mutant_name


def get_mutant_name(relative_source_path, mutant_method_name: str) -> str:
    path = Path(relative_source_path)
    if path.parts[:1] == ("workflow",):
        path = Path(*path.parts[1:])
    return _mutant_name(path, mutant_method_name)


format_utils.get_mutant_name = get_mutant_name

_load_config = configuration._load_config


def load_config():
    loaded = _load_config()
    if os.environ.get("MUTATION_TESTS", "").strip():
        loaded.pytest_add_cli_args_test_selection = os.environ["MUTATION_TESTS"].split()
    return loaded


configuration._load_config = load_config

import mutmut.__main__ as mutmut_main  # noqa: E402  (after the patch: it imports the name at load time)
import mutmut.mutation.file_mutation as file_mutation  # noqa: E402

file_mutation.get_mutant_name = get_mutant_name
mutmut_main.get_mutant_name = get_mutant_name

if __name__ == "__main__":
    sys.exit(mutmut_main.cli())
