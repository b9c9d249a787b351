# The device tool brings back at most 8 files from $OUT (no more than 2 folders down). A GPU-machine
# script that writes more sources this and packs on exit:
#
#   source bench/device-out.sh
#   trap 'out_pack "$OUT"' EXIT
#
# out_pack DIR: when DIR holds more than 8 files, every file but run.log and summary.md goes into
# DIR/results.tar.gz (read them with `tar -xzf results.tar.gz`). No other side effects.
out_pack() {
  local dir=$1 n
  n=$(find "$dir" -maxdepth 1 -type f | wc -l)
  [ "$n" -le 8 ] && return 0
  (
    cd "$dir" || exit 1
    find . -maxdepth 1 -type f ! -name run.log ! -name summary.md ! -name results.tar.gz -printf '%P\n' > .pack-list
    grep -v '^\.pack-list$' .pack-list | tar -czf results.tar.gz -T - && grep -v '^\.pack-list$' .pack-list | xargs -r rm -f --
    rm -f .pack-list
  )
}
