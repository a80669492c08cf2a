#!/usr/bin/env bash
# Are every command's outputs on the bundled models the same bytes as an earlier checkout's? (issue 52: a refactor
# changes no output.) Runs make demo's two commands (lpes-search, then lpes-convert to hf, onnx and genai),
# lpes-validate and lpes-generate on the folder they wrote, and README's tour of lpes-tiny-kv (search, convert to
# hf and onnx, validate, generate twice), once with the lpes of OLD_TREE and once with this checkout's, then
# compares every file (lpes-generate's text kept in generated.txt). validation.json, validation.md and the model card state the seconds a validation took; those
# numbers are masked before the comparison, nothing else.
#
#   git worktree add /tmp/lpes-before <commit>   # or any checkout of the earlier tree
#   bench/same_outputs.sh /tmp/lpes-before /tmp/same-outputs
#
# Uses this checkout's .venv (the libraries are the same for both runs; only lpes's own code differs).
set -euo pipefail
old_tree=$(cd "$1" && pwd)
work=$2
here=$(cd "$(dirname "$0")/.." && pwd)
python=$here/.venv/bin/python

# The package of a checkout without installing it: lpes/ with each layer's folder where pyproject.toml maps it.
package_of() {
  local tree=$1 root=$2
  mkdir -p "$root/lpes"
  for f in "$tree"/lpes/*; do ln -s "$f" "$root/lpes/"; done
  for layer in foundation converter exporters validation search; do ln -s "$tree/$layer" "$root/lpes/$layer"; done
}

run_all() {  # $1: the package root on PYTHONPATH, $2: the folder the outputs go to
  local lpes="PYTHONPATH=$1 $python -c 'import sys; from lpes import cli; sys.exit(getattr(cli, sys.argv[1])(sys.argv[2:]))'"
  mkdir -p "$2" && cd "$2"
  eval "$lpes" search_main lpes-tiny-induction --out demo/best.json --data tiny-induction:examples=20 \
    --scale-grid 0.5:4:0.25
  eval "$lpes" convert_main lpes-tiny-induction --curve demo/best.json --to hf,onnx,genai \
    --out demo/lpes-tiny-induction-lpes --data tiny-induction:examples=40
  eval "$lpes" validate_main demo/lpes-tiny-induction-lpes --data tiny-induction:examples=10
  eval "$lpes" generate_main demo/lpes-tiny-induction-lpes "'f3 k12 k33 v5 f30 k7 k9 v2 f1 q12'" \
    --max-new-tokens 3 > demo/generated.txt
  # README's tour of lpes-tiny-kv
  eval "$lpes" search_main lpes-tiny-kv --out kv-out/best.json --data tiny-kv:examples=8 --population 12 \
    --generations 8
  eval "$lpes" convert_main lpes-tiny-kv --curve kv-out/best.json --to hf,onnx --out kv-out/lpes-tiny-kv-lpes
  eval "$lpes" validate_main kv-out/lpes-tiny-kv-lpes --data tiny-kv:examples=4,length=2048
  eval "$lpes" generate_main kv-out/lpes-tiny-kv-lpes "'p3_1 f2 q3'" --max-new-tokens 1 > kv-out/generated.txt
  eval "$lpes" generate_main kv-out/lpes-tiny-kv-lpes/onnx "'p3_1 f2 q3'" --max-new-tokens 1 >> kv-out/generated.txt
  cd - >/dev/null
}

if [ "${COMPARE_ONLY:-}" != 1 ]; then  # COMPARE_ONLY=1: compare what an earlier call wrote into WORK
  rm -rf "$work" && mkdir -p "$work"
  package_of "$old_tree" "$work/pkg-before"
  package_of "$here" "$work/pkg-after"
  run_all "$work/pkg-before" "$work/before" > "$work/before.log" 2>&1
  run_all "$work/pkg-after" "$work/after" > "$work/after.log" 2>&1
fi

# Seconds a validation took ("in 3.2 s", "estimated 4 s", "took 1 min 5 s") are not outputs of the code; nor,
# therefore, the digests the output folder's marker keeps of the files that state them.
mask='s/[0-9][0-9.]* (s|min|h)\b/N \1/g'
marker_without_timed_digests() {
  "$python" -c 'import json, sys
marker = json.load(open(sys.argv[1]))
for name, entry in marker.get("files", {}).items():
    if name.endswith((".json", ".md")):
        entry.pop("sha256", None)
print(json.dumps(marker, indent=1, sort_keys=True))' "$1"
}
different=0
while IFS= read -r -d '' file; do
  rel=${file#"$work/before/"}
  case "$rel" in
    */.lpes-output) if ! diff -q <(marker_without_timed_digests "$file") \
                               <(marker_without_timed_digests "$work/after/$rel") >/dev/null; then
                      echo "differs: $rel"; different=1; fi ;;
    *.json|*.md) if ! diff -q <(sed -E "$mask" "$file") <(sed -E "$mask" "$work/after/$rel") >/dev/null; then
                   echo "differs: $rel"; different=1; fi ;;
    *) if ! cmp -s "$file" "$work/after/$rel"; then echo "differs: $rel"; different=1; fi ;;
  esac
done < <(find "$work/before" -type f -print0 | sort -z)
(cd "$work/before" && find . -type f | sort) > "$work/before.files"
(cd "$work/after" && find . -type f | sort) > "$work/after.files"
if ! cmp -s "$work/before.files" "$work/after.files"; then
  echo "the two runs wrote other files:"; diff "$work/before.files" "$work/after.files" || true; different=1
fi
echo "$(wc -l < "$work/before.files") files compared: $([ $different = 0 ] && echo "the same bytes" || echo "NOT the same")"
exit $different
