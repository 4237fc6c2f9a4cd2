#!/usr/bin/env bash
# Builds every Bazel target of jaxpt and runs the fast test targets (tag "fast"), offline:
#   tools/bazel_test.sh [extra bazel test args, e.g. //tests:test_losses_lm]
# Installs what is missing first (as root, from Debian): bazel-bootstrap (Bazel 4.2 + a JDK) and
# bazel-bootstrap-source (the local rules_cc / rules_java / platforms repositories of .bazelrc's --config=debian).
# Python and the third-party packages are the environment's (python3 on PATH, or $PYTHON_BIN_PATH).
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v bazel > /dev/null || need+=(bazel-bootstrap)
[ -d /usr/src/bazel-bootstrap/mock_repos ] || need+=(bazel-bootstrap-source)
if [ ${#need[@]} -gt 0 ]; then
  echo "bazel_test.sh: installing ${need[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${need[@]}" > /dev/null
fi
bazel --version

# The server exits 60 s after the last command (CI leaves no JVM behind); its output base is keyed by this path.
startup=(--max_idle_secs=60)
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(//...)
bazel "${startup[@]}" build --config=debian //...
bazel "${startup[@]}" test --config=debian --test_tag_filters=fast --nocache_test_results "${targets[@]}"
