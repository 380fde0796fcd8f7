#!/usr/bin/env bash
# Static analysis of the C++ sources with clang-tidy (bugprone, the clang static analyzer,
# performance, thread-unsafe calls), over a configured build's compile_commands.json: every .cpp
# of the tree (the .cu kernels are nvcc's; headers count through the files that include them).
# Not part of the test command: ~13 minutes on two cores. docs/engine.md ("Static analysis") has
# the last results and why the remaining warnings stay.
#
#   tools/tidy.sh [BUILD_DIR [FILE_REGEX...]]   default build/ (configure it first: tools/build.sh
#                                               does) and every file; regexes pick files by path
#
# Writes BUILD_DIR/tidy/warnings.txt (one line per warning, sorted, repeats dropped) and prints
# the count per check. Exit status: 0 when clang-tidy ran (warnings are for reading, not a
# verdict), 77 when clang-tidy is not installed (apt-get install clang-tidy).
set -euo pipefail
cd "$(dirname "$0")/.."
build="${1:-build}"
shift || true
runner="$(command -v run-clang-tidy || command -v run-clang-tidy-14 || true)"
[[ -n "$runner" ]] || { echo "SKIP: run-clang-tidy not found (apt-get install clang-tidy)"; exit 77; }
[[ -f "$build/compile_commands.json" ]] || { echo "$build/compile_commands.json missing: configure $build first"; exit 1; }

checks="-*,bugprone-*,clang-analyzer-*,performance-*,concurrency-mt-unsafe,cert-err58-cpp"
checks+=",misc-throw-by-value-catch-by-reference,misc-unconventional-assign-operator,misc-new-delete-overloads"
# Left out: style or noise for this code (parameters of one type side by side, int -> size_t
# index arithmetic, identical branches written for clarity, identifiers of generated code, the
# optin analyzers).
checks+=",-bugprone-easily-swappable-parameters,-bugprone-narrowing-conversions"
checks+=",-bugprone-implicit-widening-of-multiplication-result,-bugprone-branch-clone"
checks+=",-bugprone-reserved-identifier,-bugprone-exception-escape,-clang-analyzer-optin.*,-performance-avoid-endl"

out="$build/tidy"
mkdir -p "$out"
# The tree's own .cpp files only (not the generated ones under the build folder).
python3 - "$build/compile_commands.json" "$out/compile_commands.json" "$PWD" <<'PY'
import json, sys
entries = json.load(open(sys.argv[1]))
root = sys.argv[3] + "/"
rel = lambda e: e["file"][len(root):] if e["file"].startswith(root) else None
keep = [e for e in entries if rel(e) and rel(e).endswith(".cpp") and not rel(e).startswith("build")]
json.dump(keep, open(sys.argv[2], "w"), indent=1)
print(f"{len(keep)} files")
PY
"$runner" -p "$out" -j "${QTTS_JOBS:-$(nproc)}" -quiet -checks="$checks" \
    -header-filter="^$PWD/(engine|audio_io|apps|kernels|tests)/" "$@" >"$out/clang-tidy.log" 2>&1 || true
sed 's/\x1b\[[0-9;]*m//g' "$out/clang-tidy.log" | grep -E "^$PWD/.*: (warning|error): " | sed "s|^$PWD/||" |
    sort -u >"$out/warnings.txt" || true
echo "$(wc -l <"$out/warnings.txt") warnings in $out/warnings.txt, by check:"
sed 's/.*\[\(.*\)\]$/\1/' "$out/warnings.txt" | sort | uniq -c | sort -rn
