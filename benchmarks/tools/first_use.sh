#!/usr/bin/env bash
# A cold first use and five warm one-liners, for this checkout and (optionally) an older revision:
# a fresh $MARS_CACHE with the converted model linked in, then `mars generate Hi -n 8 --json` six
# times; prints each call's wall time and writes its JSON (start-up phases, choices) and notes.
#   benchmarks/tools/first_use.sh [REVISION] > out.txt     (run `mars generate hi` once first)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
models=${MARS_CACHE:-$HOME/.cache/mars-cli}/models
out=$(mktemp -d)
cd "$out"  # run from the checkout, its own mars_cli would shadow PYTHONPATH's (an older revision's)
for rev in checkout ${1:-}; do
  src=$repo
  if [ "$rev" != checkout ]; then src=$out/src-$rev; mkdir -p "$src"; git -C "$repo" archive "$rev" mars_cli | tar -x -C "$src"; fi
  cache=$out/cache-$rev; mkdir -p "$cache"; ln -s "$models" "$cache/models"
  for call in cold warm1 warm2 warm3 warm4 warm5; do
    start=$(date +%s.%N)
    MARS_SERVER=off MARS_CACHE=$cache PYTHONPATH=$src "$repo/.venv/bin/python" -c "from mars_cli.cli import main; main()" \
      generate Hi --max-new-tokens 8 --json > "$out/$rev-$call.json" 2> "$out/$rev-$call.err"
    echo "$rev $call wall $(echo "$(date +%s.%N) - $start" | bc) s, load $(cut -d' ' -f1 /proc/loadavg)"
  done
done
echo "outputs in $out"
