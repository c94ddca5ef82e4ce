#!/bin/bash
# The apex section of every tools/gpu run's config, printed to stdout: the local export of the pinned apex 25.05
# (docs/apex.md; never committed) and a build cache outside the repository, so a warm device machine builds apex once.
#
#   bash tools/gpu/apex_config.sh [source-path] > run.yaml      # APEX_SOURCE, APEX_CACHE_DIR change the defaults
set -euo pipefail
source_path=${1:-${APEX_SOURCE:-vendor/apex-25.05}}
cat <<YAML
apex:
  source: {path: $source_path, ref: "25.05", commit: 379937e1719b8190f38f3e666e2a8d32c97e221f, url: null}
  cache_dir: ${APEX_CACHE_DIR:-/tmp/amprepro-apex-cache}
YAML
